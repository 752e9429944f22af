#!/usr/bin/env python3
"""Writes LoRA gradient fixtures for the GPU trainer (head_dim 64).

The GPU attention kernels are built for head_dim 64 and 128, so the tiny
models of tests/data/models (head_dim 16 and 32) cannot run there. This makes
the same three families (llama: llama3 RoPE, tied embeddings; qwen2: q/k/v
biases; qwen3: q/k RMSNorm, rsLoRA) at head_dim 64 (hidden 128, 2 heads, 1 KV
head; qwen3 4 heads of 64 over hidden 128, 2 KV heads), stores the weights in
bf16 (what the GPU computes with, so only activations round) and then runs
make_grad_fixtures.py's LoRA case on them in float32 (eager attention):

  <out>/<family>/model/                save_pretrained of the model (bf16)
  <out>/<family>/adapter/              LoRA r=4, alpha=8, B ~ N(0, 0.1)
  <out>/<family>/lora_grads.safetensors  input_ids, labels, lengths, loss and
                                       every lora_A / lora_B gradient
  <out>/<family>/full_grads.safetensors  full-parameter SFT on the same model
                                       and batch (make_grad_fixtures.py's full
                                       case): loss and the gradients of the
                                       embedding, norms (qwen3: a k_norm),
                                       projections (qwen2: a q_proj bias) and
                                       the LM head (tied on llama)

Usage: python3 tools/make_cuda_grad_fixtures.py [--out tests/data/grad_hd64]
Needs torch, transformers, peft, safetensors. Deterministic for a given seed.
"""
import argparse
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(__file__))
import make_grad_fixtures as grad  # noqa: E402
import make_model_fixtures as models  # noqa: E402

SHAPE = dict(hidden_size=128, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1)
EXTRA = {"llama": {}, "qwen2": {}, "qwen3": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64)}


def make_model(family, out_dir, seed):
    spec = models.FAMILIES[family]
    torch.manual_seed(seed)
    kw = {**models.COMMON, **spec["kw"], **SHAPE, **EXTRA[family]}
    cfg = getattr(transformers, spec["cfg"])(**kw)
    model = getattr(transformers, spec["cls"])(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name else 0.0))
    model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out_dir)


def main():
    here = os.path.dirname(__file__)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "grad_hd64"))
    ap.add_argument("--seed", type=int, default=5678)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for i, family in enumerate(["llama", "qwen2", "qwen3"]):
        out = os.path.join(args.out, family)
        model_dir = os.path.join(out, "model")
        os.makedirs(model_dir, exist_ok=True)
        make_model(family, model_dir, args.seed + 10 * i)
        spec = dict(rslora=grad.FAMILIES[family]["rslora"])
        loss = grad.lora_case(family, spec, model_dir, out, args.seed + 10 * i)
        full = grad.full_case(grad.FAMILIES[family], model_dir, out, args.seed + 10 * i)
        print(f"{family}: lora loss {loss:.6f}, full loss {full:.6f}")


if __name__ == "__main__":
    main()
