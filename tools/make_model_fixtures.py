#!/usr/bin/env python3
"""Writes tiny random-init Llama-family models and their reference outputs.

For each family (llama, mistral, qwen2, qwen3) this builds a small model with
transformers, saves it with save_pretrained under tests/data/models/<family>/,
and records what lathe must reproduce:
  reference.safetensors  input_ids [batch, seq] i64, logits [batch, seq, vocab]
                         f32 (eager attention, float32 compute), inv_freq
                         [head_dim/2] f32 (the rotary frequencies transformers
                         computes for this config)
  greedy.json            {"prompt": [[ids]], "continuation": [[ids]],
                         "min_top2_gap": float} from generate(do_sample=False)

Usage: python3 tools/make_model_fixtures.py [--out tests/data/models]
Needs torch, transformers, safetensors. Deterministic for a given seed.
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file
import transformers

SEQ = 12
BATCH = 2
NEW_TOKENS = 16

COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    initializer_range=0.1,  # peaked enough that greedy picks are not near-ties
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

FAMILIES = {
    # Llama 3.x style: llama3 rope scaling, tied embeddings, large theta.
    "llama": dict(
        cls="LlamaForCausalLM", cfg="LlamaConfig", dtype=torch.float32,
        kw=dict(vocab_size=384, tie_word_embeddings=True, max_position_embeddings=131072,
                rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                     low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=8192))),
    # Mistral: sliding window shorter than prompt + continuation.
    "mistral": dict(
        cls="MistralForCausalLM", cfg="MistralConfig", dtype=torch.float32,
        kw=dict(vocab_size=320, sliding_window=8, tie_word_embeddings=False,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # Qwen2: q/k/v biases; weights stored as bf16.
    "qwen2": dict(
        cls="Qwen2ForCausalLM", cfg="Qwen2Config", dtype=torch.bfloat16,
        kw=dict(vocab_size=448, tie_word_embeddings=False,
                rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    # Qwen3: q/k RMSNorm over head_dim, explicit head_dim != hidden/heads.
    "qwen3": dict(
        cls="Qwen3ForCausalLM", cfg="Qwen3Config", dtype=torch.float32,
        kw=dict(vocab_size=512, head_dim=32, tie_word_embeddings=False,
                rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
}


def make(family, spec, out_dir, seed):
    torch.manual_seed(seed)
    cfg = getattr(transformers, spec["cfg"])(**{**COMMON, **spec["kw"]})
    cfg._attn_implementation = "eager"
    model = getattr(transformers, spec["cls"])(cfg).eval()
    # Biases default to zero; make them random so they are tested.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name else 0.0))
    d = os.path.join(out_dir, family)
    os.makedirs(d, exist_ok=True)
    model.to(spec["dtype"])
    model.config.dtype = spec["dtype"]
    model.save_pretrained(d)
    # References come from the saved directory loaded in float32, as a user
    # would load it (bf16 weights upcast; rotary buffers computed afresh).
    model = getattr(transformers, spec["cls"]).from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(3, cfg.vocab_size, (BATCH, SEQ), generator=g, dtype=torch.int64)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float().contiguous()
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             pad_token_id=0, eos_token_id=None,
                             output_scores=True, return_dict_in_generate=True)
    gap = float("inf")
    for s in gen.scores:
        top = torch.topk(s.float(), 2, dim=-1).values
        gap = min(gap, float((top[:, 0] - top[:, 1]).min()))
    inv_freq = model.model.rotary_emb.inv_freq.float().contiguous()
    save_file({"input_ids": ids, "logits": logits, "inv_freq": inv_freq},
              os.path.join(d, "reference.safetensors"))
    with open(os.path.join(d, "greedy.json"), "w") as f:
        json.dump({"prompt": ids.tolist(), "continuation": gen.sequences[:, SEQ:].tolist(),
                   "min_top2_gap": gap}, f, indent=1)
    size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
    print(f"{family}: {d} {size / 1e6:.2f} MB, min top-2 logit gap {gap:.4g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "models"))
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for i, (family, spec) in enumerate(FAMILIES.items()):
        make(family, spec, args.out, args.seed + 10 * i)


if __name__ == "__main__":
    main()
