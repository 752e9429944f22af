#!/usr/bin/env python3
"""Emulates lathe's GPU full-SFT pass (src/train/cuda_model_sft.cpp) on the CPU, rounding point by rounding point.

The full-parameter twin of emulate_cuda_train.py (whose pieces it reuses:
the same rounding points, norms, RoPE, flash attention, SwiGLU and the LM
head as the kernels compute them): one forward + backward of the GPU trainer
with every weight trainable and no adapter, on the head_dim-64 fixtures
(tests/data/grad_hd64/<family>), and the gradients the device adds in f32:
  - projections: dW = dyᵀ·x per member (an f32-output GEMM on the bf16 dy
    and x), biases Σ_rows dy, the forward y = bf16(x·Wᵀ + b) rounded once
    (the bias added by the GEMM's epilogue; --bias-beta: the earlier
    pipeline's bias GEMM first and the base GEMM adding to it with beta = 1,
    which cuBLASLt rounds twice, as emulate_cuda_train.py found);
  - norm weights: Σ_rows dy ⊙ (h·rstd) from the stored bf16 h;
  - LM head: gᵀ·xf with the rounded logit gradient g (tied: into the
    embedding's); embedding: the f32 gradient of the layer-0 input summed per
    token.
Cases, as tests/cuda_train/cuda_sft_test.cpp runs them: full/<family> (the
fixture batch against full_grads.safetensors' f32 HF gradients) and
full_packed/<family> (random_batch(vocab, 17) against this pass in f32,
which stands for the f32 CPU trainer). For each tensor and the loss: its
error max|Δ| / max|ref|, the test's bound (bf16_error_full.json: 2 × the
largest of HF's sdpa, eager and sdpa-math bf16 errors, as the LoRA tests
bound theirs by their two)
and the ratio: over 1 fails on the GPU, and so does a case whose median of
error / HF's error is over 1 (the summary's last figure). --draws N adds N
draws of the rounding noise.

Usage: python3 tools/emulate_cuda_sft.py [--family qwen2] [--case full|full_packed] [--f32 NAME ...]
           [--draws N] [--quiet] [--bias-beta]
Needs torch, transformers (for the RoPE frequencies), safetensors.
"""
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import emulate_cuda_train as emu  # noqa: E402
from bf16_grad_error import DATA, FAMILIES  # noqa: E402

GROUP = {0: "qkv", 3: "o", 4: "gu", 6: "down"}
BIAS_BETA = False  # --bias-beta


class FullModel(emu.Model):
    """The fixture's model with no adapter: every weight trains."""

    def __init__(self, family):
        super().__init__(family)
        self.lora = {}


def lin_fwd(p, m, x, l, js):
    W = torch.cat([m.w(l, j) for j in js])
    bs = [m.b(l, j) for j in js]
    bias = None if bs[0] is None else torch.cat(bs).expand(x.shape[0], -1)
    if bias is None or BIAS_BETA:
        return p.mm("gemm." + GROUP[js[0]], x, W.T, bias)
    return p.r("gemm." + GROUP[js[0]], x @ W.T + bias)  # the epilogue adds b in f32 before the one rounding


def lin_bwd(p, m, x, dy, l, js, grads):
    """Adds each member's dW (and db) into grads; returns dx = bf16(dy·W)."""
    col = 0
    for j in js:
        w = m.w(l, j)
        d = dy[:, col:col + w.shape[0]]
        name = f"model.layers.{l}.{emu.PROJ[j]}."
        grads[name + "weight"] += d.T @ x
        if m.b(l, j) is not None:
            grads[name + "bias"] += d.sum(0)
        col += w.shape[0]
    return p.mm("bgemm." + GROUP[js[0]], dy, torch.cat([m.w(l, j) for j in js]))


def norm_grad(grads, name, h, rstd, dy):
    grads[name] += (dy * (h * rstd)).reshape(-1, dy.shape[-1]).sum(0)


def run_pass(p, m, batch):
    """Loss (mean over supervised tokens) and every weight's gradient of one pass on a packed batch."""
    ids, labels, positions, cu = batch
    T = len(ids)
    nh, nkv, hd = m.nh, m.nkv, m.hd
    scale = 1.0 / math.sqrt(hd)
    cos, sin = emu.rope_tables(m, positions)
    grads = {k: torch.zeros_like(v) for k, v in m.W.items()}
    qd, kvd = nh * hd, nkv * hd
    pre = "model.layers."
    hs = [m.W["model.embed_tokens.weight"][ids]]
    acts = []
    xn1, rstd1 = emu.rms_fwd(p, hs[0], m.W[pre + "0.input_layernorm.weight"], m.eps)
    for l in range(m.L):
        a = {"xn1": xn1, "rstd1": rstd1}
        qkv = lin_fwd(p, m, xn1, l, [0, 1, 2])
        q = qkv[:, :qd].reshape(T, nh, hd)
        k = qkv[:, qd:qd + kvd].reshape(T, nkv, hd)
        v = p.r("store", qkv[:, qd + kvd:]).reshape(T, nkv, hd)
        if m.qk_norm:
            q, k = p.r("store", q), p.r("store", k)
            a["q_raw"], a["k_raw"] = q, k
            q, a["q_rstd"] = emu.rms_fwd(p, q, m.W[pre + f"{l}.self_attn.q_norm.weight"], m.eps)
            k, a["k_rstd"] = emu.rms_fwd(p, k, m.W[pre + f"{l}.self_attn.k_norm.weight"], m.eps)
        q, k = emu.rope(p, q, cos, sin), emu.rope(p, k, cos, sin)
        o, lse = emu.attn_fwd(p, q, k, v, cu, scale)
        a.update(q=q, k=k, v=v, o=o, lse=lse, attn=o.reshape(T, qd))
        t = lin_fwd(p, m, a["attn"], l, [3])
        h_mid = p.r("resid.mid", t + hs[l])
        xn2, rstd2 = emu.rms_fwd(p, h_mid, m.W[pre + f"{l}.post_attention_layernorm.weight"], m.eps)
        gu = lin_fwd(p, m, xn2, l, [4, 5])
        F = gu.shape[1] // 2
        act = emu.swiglu_fwd(p, gu[:, :F], gu[:, F:])
        t = lin_fwd(p, m, act, l, [6])
        a.update(h_mid=p.r("store", h_mid), xn2=xn2, rstd2=rstd2, gu=p.r("store", gu), act=act)
        hs.append(p.r("resid.hs", t + h_mid))
        last = l + 1 == m.L
        nw = m.W["model.norm.weight"] if last else m.W[pre + f"{l + 1}.input_layernorm.weight"]
        xn1, rstd1 = emu.rms_fwd(p, hs[-1], nw, m.eps)
        acts.append(a)
    xf, rstd_f = xn1, rstd1
    head_name = "model.embed_tokens.weight" if m.tied else "lm_head.weight"
    head = m.W[head_name]
    loss, glog, d_xf = emu.lm_head_ce(p, xf, head, labels)
    grads[head_name] += glog.T @ xf
    norm_grad(grads, "model.norm.weight", hs[m.L], rstd_f, d_xf)
    dh = emu.rms_bwd(hs[m.L], m.W["model.norm.weight"], rstd_f, d_xf)
    for l in reversed(range(m.L)):
        a = acts[l]
        d_act = lin_bwd(p, m, a["act"], p.r("dh_bf", dh), l, [6], grads)
        F = a["gu"].shape[1] // 2
        dg, du = emu.swiglu_bwd(p, a["gu"][:, :F], a["gu"][:, F:], d_act)
        d_xn = lin_bwd(p, m, a["xn2"], torch.cat([dg, du], 1), l, [4, 5], grads)
        w2 = pre + f"{l}.post_attention_layernorm.weight"
        norm_grad(grads, w2, a["h_mid"], a["rstd2"], d_xn)
        dh = dh + emu.rms_bwd(a["h_mid"], m.W[w2], a["rstd2"], d_xn)
        d_attn = lin_bwd(p, m, a["attn"], p.r("dh_bf", dh), l, [3], grads)
        dq, dk, dv = emu.attn_bwd(p, a["q"], a["k"], a["v"], a["o"], a["lse"], d_attn.reshape(T, nh, hd), cu, scale)
        if m.qk_norm:
            dq = emu.rope(p, dq, cos, sin, inverse=True, point="qknorm_bwd")
            dk = emu.rope(p, dk, cos, sin, inverse=True, point="qknorm_bwd")
            for x, d, n in ((a["q_raw"], dq, "q"), (a["k_raw"], dk, "k")):
                norm_grad(grads, pre + f"{l}.self_attn.{n}_norm.weight", x, a[n + "_rstd"], d)
            dq = p.r("qknorm_bwd", emu.rms_bwd(a["q_raw"], m.W[pre + f"{l}.self_attn.q_norm.weight"], a["q_rstd"], dq))
            dk = p.r("qknorm_bwd", emu.rms_bwd(a["k_raw"], m.W[pre + f"{l}.self_attn.k_norm.weight"], a["k_rstd"], dk))
        else:
            dq = emu.rope(p, dq, cos, sin, inverse=True, point="rope_bwd")
            dk = emu.rope(p, dk, cos, sin, inverse=True, point="rope_bwd")
        dqkv = torch.cat([dq.reshape(T, qd), dk.reshape(T, kvd), dv.reshape(T, kvd)], 1)
        d_xn = lin_bwd(p, m, a["xn1"], dqkv, l, [0, 1, 2], grads)
        w1 = pre + f"{l}.input_layernorm.weight"
        norm_grad(grads, w1, hs[l], a["rstd1"], d_xn)
        dh = dh + emu.rms_bwd(hs[l], m.W[w1], a["rstd1"], d_xn)
    grads["model.embed_tokens.weight"].index_add_(0, ids, dh)
    return loss, grads


class Case(emu.Case):
    """emulate_cuda_train's Case for full SFT: every weight's gradient, against full_grads.safetensors."""
    FIXTURE_KIND, FIXTURE_FILE = "full", "full_grads.safetensors"

    def make_model(self, family):
        return FullModel(family)

    def run_pass(self, p, m, batch):
        return run_pass(p, m, batch)

    def is_grad(self, name):
        return name not in ("input_ids", "labels", "lengths", "loss")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=FAMILIES, action="append")
    ap.add_argument("--case", choices=["full", "full_packed"], action="append")
    ap.add_argument("--f32", action="append", default=[], help="keep this rounding point in f32")
    ap.add_argument("--draws", type=int, default=0, help="also run N draws of the rounding noise")
    ap.add_argument("--quiet", action="store_true", help="one summary line per case")
    ap.add_argument("--bias-beta", action="store_true",
                    help="the bias as a separate GEMM the base GEMM adds to (two roundings), as before the epilogue")
    ap.add_argument("--tolerances", default=os.path.join(DATA, "bf16_error_full.json"))
    args = ap.parse_args()
    global BIAS_BETA
    BIAS_BETA = args.bias_beta
    torch.set_num_threads(1)
    for fam in args.family or FAMILIES:
        for kind in args.case or ["full", "full_packed"]:
            c = Case(fam, kind, args.tolerances)
            errs = c.errors(emu.Pass(c.m, args.f32))
            r = c.ratios(errs)
            print(f"{c.name:18s} {' '.join('--f32 ' + x for x in args.f32)} {emu.summary(r)}")
            if not args.quiet:
                for n in errs:
                    flag = "  <-- over" if r[n] > 1 else ""
                    print(f"  {emu.short(n):40s} err {errs[n]:.5f} tol {c.tolerance(n):.5f} ratio {r[n]:.2f}{flag}")
            if args.draws:
                over, worst = [], []
                for d in range(1, args.draws + 1):
                    rr = c.ratios(c.errors(emu.Pass(c.m, args.f32, draw=d)))
                    over.append(sum(v > 1 for v in rr.values()))
                    worst.append(max(rr.values()))
                print(f"    {args.draws} draws: over-tolerance per draw {sum(over) / len(over):.1f} (max {max(over)}),"
                      f" worst ratio mean {sum(worst) / len(worst):.2f} max {max(worst):.2f}")


if __name__ == "__main__":
    main()
