#!/usr/bin/env python3
"""Makes tests/data/train/adamw.{json,bin}: reference AdamW trajectories from
torch.optim.AdamW (and torch.nn.utils.clip_grad_norm_) on small random tensors.

adamw.bin holds float32 little-endian arrays back to back; adamw.json describes
each case (optimizer settings, parameters, per-step learning rate, gradients,
grad norm and parameters after the step, final moments) with element offsets
into adamw.bin. Run:  python3 tools/make_adamw_fixtures.py
"""
import json
import math
import os
import sys

import torch

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "train")


class Blob:
    def __init__(self):
        self.parts = []
        self.size = 0

    def add(self, t):
        a = t.detach().to(torch.float32).contiguous().reshape(-1)
        off = self.size
        self.parts.append(a.numpy().astype("<f4").tobytes())
        self.size += a.numel()
        return off


def run_case(blob, gen, name, cfg, shapes, lrs, clip=0.0, grad_scale=1.0):
    params = [torch.randn(n, generator=gen, dtype=torch.float32) for _, n in shapes]
    tensors = [torch.nn.Parameter(p.clone()) for p in params]
    names = [s for s, _ in shapes]
    no_decay = cfg.get("no_decay_norm_and_bias", False)

    def is_no_decay(n):
        return n.endswith(".bias") or n == "bias" or "norm" in n

    torch_kwargs = dict(betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"], amsgrad=cfg["amsgrad"],
                        maximize=cfg["maximize"], foreach=False)
    if no_decay:
        groups = [
            {"params": [t for t, n in zip(tensors, names) if not is_no_decay(n)], "weight_decay": cfg["weight_decay"]},
            {"params": [t for t, n in zip(tensors, names) if is_no_decay(n)], "weight_decay": 0.0},
        ]
    else:
        groups = [{"params": tensors, "weight_decay": cfg["weight_decay"]}]
    opt = torch.optim.AdamW(groups, lr=lrs[0], **torch_kwargs)

    case = {
        "name": name,
        "config": cfg,
        "clip_max_norm": clip,
        "params": [{"name": n, "n": int(p.numel()), "init": blob.add(p)} for n, p in zip(names, params)],
        "steps": [],
    }
    for lr in lrs:
        grads = []
        for t in tensors:
            g = torch.randn(t.shape, generator=gen, dtype=torch.float32) * grad_scale
            g[::7] = 0.0  # exact zeros exercise eps in the denominator
            grads.append(g)
        step = {"lr": lr, "grads": [blob.add(g) for g in grads]}
        for t, g in zip(tensors, grads):
            t.grad = g.clone()
        if clip > 0.0:
            norm = torch.nn.utils.clip_grad_norm_(tensors, clip, foreach=False)
            step["grad_norm"] = float(norm)
        for grp in opt.param_groups:
            grp["lr"] = lr
        opt.step()
        step["params_after"] = [blob.add(t) for t in tensors]
        case["steps"].append(step)
    st = [opt.state[t] for t in tensors]
    case["final"] = {
        "exp_avg": [blob.add(s["exp_avg"]) for s in st],
        "exp_avg_sq": [blob.add(s["exp_avg_sq"]) for s in st],
        "max_exp_avg_sq": [blob.add(s["max_exp_avg_sq"]) for s in st] if cfg["amsgrad"] else [],
    }
    return case


def config(beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2, amsgrad=False, maximize=False, no_decay=False):
    return {"beta1": beta1, "beta2": beta2, "eps": eps, "weight_decay": weight_decay, "amsgrad": amsgrad,
            "maximize": maximize, "no_decay_norm_and_bias": no_decay}


def cosine_lrs(max_lr, min_lr, warmup, total):
    out = []
    for s in range(total):
        if s <= warmup:
            out.append(max_lr * (s + 1) / (warmup + 1))
        else:
            out.append(min_lr + (max_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * (s - warmup) / (total - warmup))))
    return out


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    blob = Blob()
    shapes = [("layers.0.self_attn.q_proj.lora_A.weight", 301), ("layers.0.mlp.up_proj.lora_B.weight", 37),
              ("scalar", 1)]
    group_shapes = [("model.layers.0.mlp.down_proj.weight", 257), ("model.layers.0.input_layernorm.weight", 33),
                    ("lm_head.bias", 9)]
    cases = [
        run_case(blob, gen, "torch_defaults_1step", config(), shapes, [1e-3]),
        run_case(blob, gen, "torch_defaults_5steps", config(), shapes, [1e-3] * 5),
        run_case(blob, gen, "nemo_groups_clip_cosine", config(beta2=0.98, eps=1e-5, weight_decay=0.1, no_decay=True),
                 group_shapes, cosine_lrs(1e-2, 1e-4, 2, 6), clip=1.0, grad_scale=3.0),
        run_case(blob, gen, "amsgrad_maximize", config(beta1=0.6, weight_decay=0.05, amsgrad=True, maximize=True),
                 shapes, [3e-3, 2e-3, 1e-3, 5e-4]),
        run_case(blob, gen, "lerp_large_weight_no_clip_needed", config(beta1=0.3, beta2=0.9, weight_decay=0.0),
                 shapes, [1e-2] * 3, clip=100.0),
    ]
    manifest = {
        "made_by": "tools/make_adamw_fixtures.py with torch " + torch.__version__ +
                   " (torch.optim.AdamW foreach=False, torch.nn.utils.clip_grad_norm_)",
        "bin": "adamw.bin",
        "cases": cases,
    }
    os.makedirs(OUT_DIR, exist_ok=True)
    with open(os.path.join(OUT_DIR, "adamw.bin"), "wb") as f:
        for p in blob.parts:
            f.write(p)
    with open(os.path.join(OUT_DIR, "adamw.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"wrote {blob.size} floats in {len(cases)} cases to {OUT_DIR}", file=sys.stderr)


if __name__ == "__main__":
    main()
