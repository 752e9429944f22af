#!/usr/bin/env python3
"""Hugging Face transformers + PEFT LoRA SFT throughput, the baseline of bench_train_cuda.

Random-init Llama-3.2-1B and Llama-3.1-8B shapes (made on the GPU, bf16,
sdpa attention), LoRA r=32 / alpha=32 / dropout 0 on all seven projections
(PEFT keeps the adapters in float32), torch.optim.AdamW (fused) with gradient
clipping at 1.0, random token rows of seq tokens (labels = input_ids, shifted
inside the model), one optimizer step per micro batch; eager and under
torch.compile. Prints the same table as bench_train_cuda: tokens/s, step
time, peak GPU memory (torch.cuda.max_memory_allocated) and model FLOP/s
(the same count: forward + input gradients of the frozen base, LM head,
causal attention forward and backward, LoRA) against 810 TFLOP/s.

Usage: python3 bench/train_cuda_hf.py [--shape 1b|8b|all] [--mode eager|compile|all]
                                      [--compile] [--steps 10] [--warmup 3] [--seq 2048]
--compile is --mode compile (the torch.compile baseline alone); the compiled
model's first warm-up steps include the compilation, so the timed steps
never do. Both modes print the same row.
Needs torch (CUDA), transformers, peft.
"""
import argparse
import gc
import time

import peft
import torch
import transformers

SHAPES = {
    "1b": dict(name="llama-3.2-1b", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
               num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
               tie_word_embeddings=True, micro_batch=8),
    "8b": dict(name="llama-3.1-8b", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
               num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
               tie_word_embeddings=False, micro_batch=4),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def flops_per_token(s, seq, r):
    H, F = s["hidden_size"], s["intermediate_size"]
    qd, kvd = s["num_attention_heads"] * s["head_dim"], s["num_key_value_heads"] * s["head_dim"]
    lin = 2.0 * (H * qd + 2 * H * kvd + qd * H + 3 * H * F)
    lora = 2.0 * r * ((H + qd) + 2 * (H + kvd) + (qd + H) + 2 * (H + F) + (F + H))
    attn = 2.0 * seq * qd
    head = 2.0 * s["vocab_size"] * H
    return s["num_hidden_layers"] * (2 * lin + 3 * lora + 3.5 * attn) + 2 * head


def build(s, seq, r):
    cfg = transformers.LlamaConfig(
        vocab_size=s["vocab_size"], hidden_size=s["hidden_size"], intermediate_size=s["intermediate_size"],
        num_hidden_layers=s["num_hidden_layers"], num_attention_heads=s["num_attention_heads"],
        num_key_value_heads=s["num_key_value_heads"], head_dim=s["head_dim"],
        tie_word_embeddings=s["tie_word_embeddings"], max_position_embeddings=max(seq, 8192),
        rms_norm_eps=1e-5, rope_parameters=dict(rope_type="default", rope_theta=500000.0))
    cfg._attn_implementation = "sdpa"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    lora = peft.LoraConfig(r=r, lora_alpha=r, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, lora)
    model.train()
    return model


def run(key, mode, args):
    s = SHAPES[key]
    torch.manual_seed(0)
    model = build(s, args.seq, args.r)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    mb = s["micro_batch"]
    ids = torch.randint(0, s["vocab_size"], (mb, args.seq), device="cuda")

    def step():
        loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    tps = mb * args.seq * args.steps / dt
    tflops = tps * flops_per_token(s, args.seq, args.r) / 1e12
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"| {s['name']} ({mode}) | {mb} x {args.seq} | {tps:.0f} | {1e3 * dt / args.steps:.1f} | {peak:.1f} | "
          f"{tflops:.0f} | {100 * tflops / 810:.1f}% | {loss.item():.4f} |", flush=True)
    del model, fwd, opt, params, ids
    gc.collect()
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="all", choices=["1b", "8b", "all"])
    ap.add_argument("--mode", default="all", choices=["eager", "compile", "all"])
    ap.add_argument("--compile", action="store_true", help="same as --mode compile")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--r", type=int, default=32)
    args = ap.parse_args()
    if args.compile:
        args.mode = "compile"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}, "
          f"{torch.cuda.get_device_name()}")
    print("| shape | batch x seq | tokens/s | ms/step | peak GiB | model TFLOP/s | of 810 | loss |")
    print("|---|---|---|---|---|---|---|---|")
    for key in (["1b", "8b"] if args.shape == "all" else [args.shape]):
        for mode in (["eager", "compile"] if args.mode == "all" else [args.mode]):
            run(key, mode, args)


if __name__ == "__main__":
    main()
