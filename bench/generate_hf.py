#!/usr/bin/env python3
"""Baseline for bench_generate_cuda: transformers on the same GPU at the same
shapes (Llama-3.2-1B, Llama-3.1-8B; random init made on the device, bf16,
sdpa attention), the same prompt length and number of new tokens, greedy,
batch B (B copies of the prompt, as bench_generate_cuda --batch B gives
every sequence the same prompt). Prefill is one forward over the B prompts;
decode is generate() with a static cache (when this transformers has it)
minus that prefill, per step; decode tokens/s counts all B sequences.

  python3 bench/generate_hf.py [--shape 1b|8b|all] [--prompt 512] [--decode 256] [--batch 1] [--compile]
"""
import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    "1b": ("Llama-3.2-1B", dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                                num_key_value_heads=8, intermediate_size=8192, tie_word_embeddings=True)),
    "8b": ("Llama-3.1-8B", dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                num_key_value_heads=8, intermediate_size=14336, tie_word_embeddings=False)),
}


def make_model(kw):
    cfg = LlamaConfig(vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
                      rope_theta=500000.0, head_dim=kw["hidden_size"] // kw["num_attention_heads"],
                      rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                      attn_implementation="sdpa", **kw)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.eval()
    model.generation_config.pad_token_id = 0
    return model


def sync_time(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def run(name, kw, n_prompt, n_decode, batch, compile_forward):
    model = make_model(kw)
    if compile_forward:
        model.forward = torch.compile(model.forward, mode="reduce-overhead")
    params = sum(p.numel() for p in model.parameters())
    ids = torch.tensor([[(i * 7919 + 13) % 128256 for i in range(n_prompt)]] * batch, device="cuda")
    gen_kw = dict(max_new_tokens=n_decode, min_new_tokens=n_decode, do_sample=False)
    cache = "static"
    with torch.inference_mode():
        try:
            model.generate(ids, cache_implementation=cache, **gen_kw)  # warm-up (and compile)
        except Exception as e:  # noqa: BLE001 - fall back to the dynamic cache
            print(f"static cache unavailable ({type(e).__name__}: {e}); using the dynamic cache")
            cache = None
            model.generate(ids, **gen_kw)
        prefill = min(sync_time(lambda: model(ids))[0] for _ in range(3))
        total = min(sync_time(lambda: model.generate(ids, cache_implementation=cache, **gen_kw)
                              if cache else model.generate(ids, **gen_kw))[0] for _ in range(3))
    decode = (total - prefill) / (n_decode - 1)  # seconds per step; the first new token comes from the prefill
    print(f"| {name} | {params / 1e9:.2f}B | {batch} | {n_prompt} | {batch * n_prompt / prefill:.0f} | "
          f"{batch / decode:.1f} | "
          f"{cache or 'dynamic'}{' + compile' if compile_forward else ''} |", flush=True)
    del model
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="all", choices=["1b", "8b", "all"])
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    ap.add_argument("--compile", action="store_true", help="torch.compile the forward (reduce-overhead)")
    args = ap.parse_args()
    print(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}")
    print("| shape | params | batch | prompt | prefill tok/s | decode tok/s | cache |\n|---|---|---|---|---|---|---|")
    for key in (["1b", "8b"] if args.shape == "all" else [args.shape]):
        name, kw = SHAPES[key]
        run(name, kw, args.prompt, args.decode, args.batch, args.compile)


if __name__ == "__main__":
    main()
