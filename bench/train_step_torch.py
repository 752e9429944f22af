#!/usr/bin/env python3
"""Baseline for bench_train_step: one LoRA (or full-SFT) training micro batch of
a random-init Llama with transformers + PEFT on PyTorch's CPU backend, the same
shapes, threads and batch (rows of one document each, loss on every next
token), timed over a few passes (best and median). Precision 32 runs f32
throughout; bf16 runs the forward under torch.autocast('cpu', dtype=torch.bfloat16)
(weights stay f32, matrix products take bf16 operands; backward follows).

Usage: python3 bench/train_step_torch.py [threads] [hidden] [layers] [ffn] [vocab] [batch] [seq] [lora_r|full] [32|bf16]
"""
import contextlib
import statistics
import sys
import time

import torch
import transformers


def main():
    a = sys.argv[1:] + [None] * 9
    threads, H, L, F, V, B, S = (int(x) if x else d for x, d in zip(a[:7], (2, 512, 8, 1376, 32000, 4, 256)))
    mode = a[7] or "16"
    bf16 = a[8] == "bf16"
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=H, intermediate_size=F, num_hidden_layers=L, num_attention_heads=8,
                                   num_key_value_heads=8, vocab_size=V, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                   max_position_embeddings=4096)
    model = transformers.LlamaForCausalLM(cfg).float().train()
    if mode != "full":
        import peft
        model = peft.get_peft_model(model, peft.LoraConfig(
            r=int(mode), lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    ids = torch.randint(0, V, (B, S))
    times = []
    for rep in range(6):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        if rep > 0:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    label = "full SFT" if mode == "full" else f"LoRA r={mode}"
    print(f"| torch {torch.__version__} {label} {'bf16 autocast' if bf16 else '32'} | {threads} threads | {B}x{S} tokens | best {min(times):.3f} s "
          f"| median {med:.3f} s | {B * S / med:.0f} tokens/s | attn {model.config._attn_implementation} |")


if __name__ == "__main__":
    main()
