#!/usr/bin/env python3
"""Measures how far Hugging Face's own bf16 run is from its f32 run, per test case.

The GPU generation tests (tests/cuda/causal_lm_gen_test.cpp) hold bf16 weights
and keep activations in bf16, and compare against an f32 reference. Their
tolerance is what transformers itself gets on the same model and inputs when
run the way its users run bf16 (weights and compute in bf16, the default
attention implementation): the GPU must be at least as close to the f32
reference as that. The metric is the test's: max|got - want| / max|want| over
the logits compared.

Cases, mirroring the tests:
  fixture/<family>/row<b>  tests/data/models/<family>: the full-sequence logits
      of reference.safetensors row b (HF f32, eager) against the model loaded
      in bf16.
  greedy/<family>  the fixture with its weights rounded to bf16, run in f32:
      32 greedy tokens after prompt row 0, one step at a time with a KV
      cache; the bf16 model teacher-forced on those tokens the same way. The
      error is the largest over the 32 steps (the test checks every step).
  random/<family><head_dim>  the same comparison on the random-init models
      the test builds (write_random_model: vocab 512, 4 heads, 2 KV heads,
      hidden 2*head_dim, ffn 4*head_dim, 2 layers, seed 7, std 0.1, bf16),
      reproduced here from lathe's counter-based generator (random_init.cpp),
      with the test's prompt (i*37+11) % 512, i < 20.
  adapter/<name>  tests/data/adapters/<name>: PEFT's f32 reference logits
      against the base model with the adapter merged, then cast to bf16.

`error` is with the default attention (sdpa), the tolerance; `error_eager`
is the same run with eager attention, recorded to show how much the number
moves between two equally valid bf16 runs. Greedy cases also record the f32
greedy `tokens` and `decisive_steps` (steps whose top-2 gap exceeds twice the
error times max|logit|, as the test counts them). Each case also records `wrong`: the error of a deliberately broken f32 model
(adapter left out; sliding window ignored), to show the tolerance still
separates a real bug from bf16 rounding.

Usage: python3 tools/bf16_reference_error.py [--out tests/data/models/bf16_error.json]
Needs torch, transformers, peft, safetensors, numpy. Deterministic.
"""
import argparse
import json
import os
import tempfile

import numpy as np
import peft
import torch
import transformers
from safetensors.torch import load_file, save_file

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")
FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]
ADAPTERS = ["llama-lora", "llama-rslora"]
GREEDY_TOKENS = 32
RANDOM_CASES = [("llama", 64, 0), ("mistral", 128, 8)]
RANDOM_PROMPT = [(i * 37 + 11) % 512 for i in range(20)]
RANDOM_SEED = 7
RANDOM_STD = 0.1
ATTN = "sdpa"  # transformers' default; main() also runs "eager" for comparison


def rel_error(got, want):
    got, want = got.double(), want.double()
    return ((got - want).abs().max() / want.abs().max()).item()


def load(path, dtype, **kw):
    m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=ATTN, **kw)
    return m.eval()


# --- lathe's random init (src/models/random_init.cpp), in numpy -------------

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
GAMMA = np.uint64(0x9E3779B97F4A7C15)


def mix64(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def tensor_key(seed, name):
    h = 0xCBF29CE484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    with np.errstate(over="ignore"):
        return mix64(np.array([(seed * 0x9E3779B97F4A7C15 + h) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]


def random_normal(seed, name, n, std):
    pairs = np.arange((n + 1) // 2, dtype=np.uint64)
    key = tensor_key(seed, name)
    with np.errstate(over="ignore"):
        a = mix64(key + (np.uint64(2) * pairs + np.uint64(1)) * GAMMA)
        b = mix64(key + (np.uint64(2) * pairs + np.uint64(2)) * GAMMA)
    u1 = ((a >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0 ** -53
    u2 = (b >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    r = np.sqrt(-2.0 * np.log(u1)) * float(np.float32(std))
    out = np.empty(2 * len(pairs), dtype=np.float32)
    out[0::2] = (r * np.cos(2 * np.pi * u2)).astype(np.float32)
    out[1::2] = (r * np.sin(2 * np.pi * u2)).astype(np.float32)
    return out[:n]


def write_random_model(path, family, head_dim, window):
    d, ff, v, heads, kv = 2 * head_dim, 4 * head_dim, 512, 4, 2
    cfg = {"architectures": ["MistralForCausalLM" if family == "mistral" else "LlamaForCausalLM"],
           "model_type": family, "vocab_size": v, "hidden_size": d, "intermediate_size": ff,
           "num_hidden_layers": 2, "num_attention_heads": heads, "num_key_value_heads": kv,
           "head_dim": head_dim, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": False,
           "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": None,
           "pad_token_id": None, "eos_token_id": None, "use_cache": True}
    if family == "llama":
        cfg.update(attention_bias=False, mlp_bias=False)
    else:
        cfg["sliding_window"] = window or None
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    shapes = [("model.embed_tokens.weight", (v, d))]
    for layer in range(2):
        p = f"model.layers.{layer}."
        shapes += [(p + "self_attn.q_proj.weight", (heads * head_dim, d)),
                   (p + "self_attn.k_proj.weight", (kv * head_dim, d)),
                   (p + "self_attn.v_proj.weight", (kv * head_dim, d)),
                   (p + "self_attn.o_proj.weight", (d, heads * head_dim)),
                   (p + "mlp.gate_proj.weight", (ff, d)), (p + "mlp.up_proj.weight", (ff, d)),
                   (p + "mlp.down_proj.weight", (d, ff)),
                   (p + "input_layernorm.weight", (d,)), (p + "post_attention_layernorm.weight", (d,))]
    shapes += [("model.norm.weight", (d,)), ("lm_head.weight", (v, d))]
    tensors = {}
    for name, shape in shapes:
        n = int(np.prod(shape))
        vals = np.ones(n, np.float32) if name.endswith("norm.weight") else random_normal(RANDOM_SEED, name, n, RANDOM_STD)
        tensors[name] = torch.from_numpy(vals.reshape(shape)).to(torch.bfloat16)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    emb = tensors["model.embed_tokens.weight"].float()
    return {"embed_tokens_first": emb.flatten()[:4].tolist(),
            "weights_abs_sum": float(sum(t.float().double().abs().sum().item() for t in tensors.values()))}


# --- measurements ----------------------------------------------------------

def step_logits(model, prompt, tokens):
    """Logits after prompt, then after each of tokens but the last, one step at a time."""
    out = []
    with torch.no_grad():
        r = model(torch.tensor([prompt]), use_cache=True)
        out.append(r.logits[0, -1].float())
        cache = r.past_key_values
        for t in tokens[:-1]:
            r = model(torch.tensor([[t]]), past_key_values=cache, use_cache=True)
            out.append(r.logits[0, -1].float())
            cache = r.past_key_values
    return out


def greedy(model, prompt, n):
    tokens, out = [], []
    with torch.no_grad():
        r = model(torch.tensor([prompt]), use_cache=True)
        for _ in range(n):
            logits = r.logits[0, -1].float()
            out.append(logits)
            tokens.append(int(logits.argmax()))
            r = model(torch.tensor([[tokens[-1]]]), past_key_values=r.past_key_values, use_cache=True)
    return tokens, out


def decisive(logits, tol):
    n = 0
    for x in logits:
        top = torch.topk(x, 2).values
        n += int((top[0] - top[1]).item() > 2 * tol * x.abs().max().item())
    return n


def greedy_case(path, prompt, wrong_kw=None):
    """HF bf16 vs HF f32 on the same bf16-rounded weights, teacher-forced on f32's greedy tokens."""
    f32 = load(path, torch.float32)
    with torch.no_grad():
        for p in f32.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    tokens, want = greedy(f32, prompt, GREEDY_TOKENS)
    got = step_logits(load(path, torch.bfloat16), prompt, tokens)
    errs = [rel_error(g, w) for g, w in zip(got, want)]
    case = {"error": max(errs), "step_errors": [round(e, 5) for e in errs], "tokens": tokens}
    case["decisive_steps"] = decisive(want, case["error"])
    if wrong_kw:
        broken = load(path, torch.float32, **wrong_kw)
        with torch.no_grad():
            for p in broken.parameters():
                p.copy_(p.to(torch.bfloat16).float())
        case["wrong"] = {"what": "sliding window ignored",
                         "error": max(rel_error(g, w) for g, w in zip(step_logits(broken, prompt, tokens), want))}
    return case


def fixture_cases():
    cases = {}
    for fam in FAMILIES:
        path = os.path.join(DATA, "models", fam)
        ref = load_file(os.path.join(path, "reference.safetensors"))
        bf16 = load(path, torch.bfloat16)
        with torch.no_grad():
            got = bf16(ref["input_ids"]).logits.float()
        for b in range(ref["input_ids"].shape[0]):
            cases[f"fixture/{fam}/row{b}"] = {"error": rel_error(got[b], ref["logits"][b])}
        wrong = {"sliding_window": None} if fam == "mistral" else None
        cases[f"greedy/{fam}"] = greedy_case(path, ref["input_ids"][0].tolist(), wrong)
    return cases


def random_cases():
    cases = {}
    for fam, hd, window in RANDOM_CASES:
        with tempfile.TemporaryDirectory() as tmp:
            record = write_random_model(tmp, fam, hd, window)
            wrong = {"sliding_window": None} if window else None
            case = greedy_case(tmp, RANDOM_PROMPT, wrong)
        case.update(record)
        cases[f"random/{fam}{hd}"] = case
    return cases


def adapter_cases():
    cases = {}
    base_dir = os.path.join(DATA, "models", "llama")
    for name in ADAPTERS:
        path = os.path.join(DATA, "adapters", name)
        ref = load_file(os.path.join(path, "reference.safetensors"))
        model = peft.PeftModel.from_pretrained(load(base_dir, torch.float32), path).merge_and_unload()
        model = model.to(torch.bfloat16).eval()
        with torch.no_grad():
            got = model(ref["input_ids"]).logits.float()
            base = load(base_dir, torch.float32)(ref["input_ids"]).logits.float()
        cases[f"adapter/{name}"] = {"error": rel_error(got, ref["logits"]),
                                    "wrong": {"what": "adapter left out", "error": rel_error(base, ref["logits"])}}
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(DATA, "models", "bf16_error.json"))
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # reproducible reductions
    global ATTN
    runs = {}
    for ATTN in ("eager", "sdpa"):  # sdpa last: the default, and the tolerance
        cases = {}
        cases.update(fixture_cases())
        cases.update(random_cases())
        cases.update(adapter_cases())
        runs[ATTN] = cases
    for name, c in cases.items():
        c["error"] = round(c["error"], 5)
        c["error_eager"] = round(runs["eager"][name]["error"], 5)
        if "wrong" in c:
            c["wrong"]["error"] = round(c["wrong"]["error"], 5)
    doc = {"what": "Hugging Face bf16 (weights and compute) vs f32: max|diff| / max|ref| of the logits",
           "made_by": "python3 tools/bf16_reference_error.py",
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "peft": peft.__version__},
           "attn_implementation": "error: sdpa (the default); error_eager: eager, for comparison",
           "greedy_tokens": GREEDY_TOKENS, "cases": cases}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    for name, c in cases.items():
        extra = f"  decisive {c['decisive_steps']}" if "decisive_steps" in c else ""
        wrong = f"  wrong({c['wrong']['what']}) {c['wrong']['error']:.4f}" if "wrong" in c else ""
        print(f"{name:24s} {c['error']:.4f} (eager {c['error_eager']:.4f}){extra}{wrong}")


if __name__ == "__main__":
    main()
