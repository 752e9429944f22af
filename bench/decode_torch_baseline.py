#!/usr/bin/env python3
"""Baseline for bench/decode_bench.sh: the same batch-1 decode in PyTorch +
transformers on the CPU (bf16 weights as stored, the same prompt ids, greedy,
KV cache), timed the same way: each single-token forward after the prefill."""
import argparse
import os
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args()
    threads = int(os.environ.get("LATHE_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    model.eval()
    vocab = model.config.vocab_size
    prompt = torch.tensor([[(i * 7 + 3) % vocab for i in range(args.prompt_tokens)]])
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model(prompt, use_cache=True)
        prefill = time.perf_counter() - t0
        past = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        steps = []
        for _ in range(args.new_tokens - 1):
            t = time.perf_counter()
            out = model(nxt, past_key_values=past, use_cache=True)
            past = out.past_key_values
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            steps.append(time.perf_counter() - t)
    print(f"torch {torch.__version__}, threads {threads}")
    print(f"prefill: {args.prompt_tokens} tokens in {prefill:.3f} s")
    print(f"decode tokens/s, batch 1: {len(steps) / sum(steps):.2f}")


if __name__ == "__main__":
    main()
