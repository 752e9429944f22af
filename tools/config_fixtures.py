#!/usr/bin/env python3
"""Reference data for lathe's config.json / generation_config.json parser.

  tools/config_fixtures.py make
      Reads the transformers 4.x config.json files in tests/data/configs/v4/
      (published configs of real models), loads each with transformers
      (AutoConfig), re-saves it with the installed transformers (5.x spelling:
      "rope_parameters", "dtype") into tests/data/configs/v5/, and writes
      tests/data/configs/expected.json: what transformers itself understands
      from each file (sizes, rope, eos ids, and the bias / q-k-norm layout read
      off a miniature model built from the config). Also expected values for
      tests/data/configs/generation/*.json via GenerationConfig.

  tools/config_fixtures.py check ORIGINAL WRITTEN [ORIGINAL WRITTEN ...]
      Loads each pair of config.json files with transformers and exits
      non-zero when the two of a pair describe different models (used by hf_config_test to check that
      lathe's model_config_to_json output loads in transformers).
"""
import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CONFIGS = os.path.join(ROOT, "tests", "data", "configs")


def load_config(path):
    from transformers import AutoConfig

    with tempfile.TemporaryDirectory() as d:
        shutil.copy(path, os.path.join(d, "config.json"))
        return AutoConfig.from_pretrained(d)


def layout(cfg):
    """Which projections carry biases, read off a one-layer miniature model."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    small = copy.deepcopy(cfg)
    small.num_attention_heads, small.num_key_value_heads = 4, 4
    small.hidden_size, small.intermediate_size, small.vocab_size = 32, 16, 64
    small.head_dim = 8
    small.num_hidden_layers = 1
    if hasattr(small, "layer_types") and small.layer_types is not None:
        small.layer_types = small.layer_types[:1]
    if getattr(small, "max_window_layers", None) is not None:
        small.max_window_layers = 1
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(small)
    layer = model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    return {
        "attention_bias": attn.q_proj.bias is not None,
        "attention_out_bias": attn.o_proj.bias is not None,
        "mlp_bias": mlp.gate_proj.bias is not None,
        "qk_norm": hasattr(attn, "q_norm"),
    }


def describe(cfg, with_layout=True):
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    eos = cfg.eos_token_id
    eos = [] if eos is None else (list(eos) if isinstance(eos, (list, tuple)) else [eos])
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    dtype = getattr(cfg, "dtype", None)
    dtype = str(dtype).replace("torch.", "") if dtype is not None else "float32"
    window = getattr(cfg, "sliding_window", None)
    if getattr(cfg, "use_sliding_window", True) is False:
        window = None
    rope_type = rope.get("rope_type", "default")
    d = {
        "model_type": cfg.model_type,
        "architecture": (cfg.architectures or [""])[0],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": getattr(cfg, "num_key_value_heads", None) or heads,
        "head_dim": head_dim,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": rope.get("rope_theta"),
        "rope_type": "" if rope_type == "default" else rope_type,
        "rope_factor": rope.get("factor", 1.0),
        "rope_low_freq_factor": rope.get("low_freq_factor", 1.0),
        "rope_high_freq_factor": rope.get("high_freq_factor", 4.0),
        "rope_original_max_position_embeddings": rope.get("original_max_position_embeddings", 8192),
        "tie_word_embeddings": bool(cfg.tie_word_embeddings),
        "hidden_act": cfg.hidden_act,
        "torch_dtype": dtype,
        "bos_token_id": -1 if cfg.bos_token_id is None else cfg.bos_token_id,
        "eos_token_ids": eos,
        "pad_token_id": -1 if cfg.pad_token_id is None else cfg.pad_token_id,
        "sliding_window": window or 0,
    }
    if with_layout:
        d.update(layout(cfg))
    else:  # the config's own switches; cheaper than building a model
        d.update({k: getattr(cfg, k, None) for k in ("attention_bias", "mlp_bias", "use_sliding_window")})
    return d


def describe_generation(path):
    from transformers import GenerationConfig

    with tempfile.TemporaryDirectory() as d:
        shutil.copy(path, os.path.join(d, "generation_config.json"))
        g = GenerationConfig.from_pretrained(d)
    eos = g.eos_token_id
    eos = [] if eos is None else (list(eos) if isinstance(eos, (list, tuple)) else [eos])
    # transformers 5 leaves unset sampling knobs as None and applies these
    # defaults at generate() time (4.x stored them).
    pick = lambda v, dflt: dflt if v is None else v
    return {
        "eos_token_ids": eos,
        "bos_token_id": pick(g.bos_token_id, -1),
        "pad_token_id": pick(g.pad_token_id, -1),
        "do_sample": bool(g.do_sample),
        "temperature": pick(g.temperature, 1.0),
        "top_k": pick(g.top_k, 50),
        "top_p": pick(g.top_p, 1.0),
        "min_p": pick(g.min_p, 0.0),
        "repetition_penalty": pick(g.repetition_penalty, 1.0),
        "max_new_tokens": pick(g.max_new_tokens, -1),
    }


def make():
    v4 = os.path.join(CONFIGS, "v4")
    v5 = os.path.join(CONFIGS, "v5")
    os.makedirs(v5, exist_ok=True)
    expected = {}
    for name in sorted(os.listdir(v4)):
        cfg = load_config(os.path.join(v4, name))
        expected["v4/" + name] = describe(cfg)
        with tempfile.TemporaryDirectory() as d:
            cfg.save_pretrained(d)
            shutil.copy(os.path.join(d, "config.json"), os.path.join(v5, name))
        expected["v5/" + name] = describe(load_config(os.path.join(v5, name)))
    gen = os.path.join(CONFIGS, "generation")
    for name in sorted(os.listdir(gen)):
        expected["generation/" + name] = describe_generation(os.path.join(gen, name))
    with open(os.path.join(CONFIGS, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


def check(paths):
    bad = []
    for original, written in zip(paths[::2], paths[1::2]):
        a, b = describe(load_config(original), False), describe(load_config(written), False)
        bad += [f"{written}: {k}: {a[k]!r} != {b.get(k)!r}" for k in a if a[k] != b.get(k)]
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["make"]:
        make()
    elif sys.argv[1:2] == ["check"] and len(sys.argv) >= 4 and len(sys.argv) % 2 == 0:
        sys.exit(check(sys.argv[2:]))
    else:
        sys.exit(__doc__)
