#!/usr/bin/env python3
"""How far Hugging Face + PEFT's bf16 LoRA training curve drifts from its f32 curve.

tests/cli/cuda_finetune_e2e.sh trains one LoRA recipe on the CPU (f32) and on
the GPU (bf16 base, bf16 activations, f32 accumulation and LoRA masters) and
asks every step's loss to agree. How close is close enough is what the
reference stack gets on the same job: transformers + PEFT run with the base
loaded in bfloat16 (PEFT keeps the adapter in f32 and runs its branch in f32,
the analogue of lathe's GPU path) against the same run in f32, same adapter
initialization, same batches, same optimizer. Per step, |bf16 − f32| / f32 of
the training loss (the loss of the step's forward, before its update).

The job mirrors the script's: the tiny preset of `lathe init-model` (seed 1,
bf16 weights) regrouped to head_dim 64, data/sample/training.jsonl as
"{input} {output}" examples (prompt unsupervised, EOS appended), and
recipes/tiny_lora.yaml with the script's overrides (lr 1e-2, 5 warmup steps,
so that 30 steps memorize the set): LoRA r 32 / alpha 32 on all seven
projections, no dropout, starting from lathe's own adapter initialization
(its A draw, B = 0; lathe_init), so that HF trains from exactly the state
both lathe runs start from. This matters: the job amplifies early rounding
(Adam's first updates of a small gradient are nearly its sign), and how
much depends on the draw. From PEFT's own draw (seed 1234) HF's bf16 runs
ended within 2.2% of f32; from lathe's draw they end 4.4% (sdpa) and 10.9%
(eager) above it. The f32 run from lathe's draw reproduces lathe's CPU
curve to five digits, which checks that the job is the same. AdamW,
betas (0.9, 0.98), eps 1e-5, no weight decay; linear warmup then cosine to
1e-4 at the last step; gradient clipping at norm 1. Global batch 30 = the whole training set, so every step
sees every example, one token-weighted mean loss.

`step_errors` is the default (sdpa) attention; `step_errors_eager` the same
bf16 run with eager attention, recorded to show how much the numbers move
between two equally valid bf16 runs.

Full-parameter SFT (--full, written to bf16_curve_error_full.json): the same
job with every weight trained (the script's peft.peft_scheme=none case, lr
FULL_LR) and no adapter. The bf16 run is mixed precision as lathe's GPU path
and NeMo's bf16 recipes run it: f32 master weights and AdamW state, each
step's forward and backward on a bf16 copy of the masters (weights and
activations bf16), its bf16 gradients widened to f32 for clipping and the
update. The f32 run is the same with no copy.

Usage: python3 tools/bf16_curve_error.py --lathe build/bin/lathe [--full]
         [--steps 30] [--out tests/data/cuda_finetune/bf16_curve_error.json]
Needs torch, transformers, peft, tokenizers. Deterministic (one thread).
"""
import argparse
import glob
import json
import math
import os
import subprocess
import tempfile

import peft
import safetensors.torch
import torch
import transformers
from tokenizers import Tokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LR, MIN_LR, WARMUP, BETAS, EPS, CLIP = 1e-2, 1e-4, 5, (0.9, 0.98), 1e-5, 1.0
RANK, ALPHA = 32, 32
FULL_LR = 1e-3  # --full: the script's optim.lr for full SFT
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_model(lathe, out):
    """The script's model: init-model's tiny preset, attention regrouped to head_dim 64."""
    subprocess.run([lathe, "init-model", "--preset", "tiny", "--out", out, "--seed", "1", "--dtype", "bf16"],
                   check=True, stdout=subprocess.DEVNULL)
    path = os.path.join(out, "config.json")
    c = json.load(open(path))
    c.update(num_attention_heads=2, num_key_value_heads=1, head_dim=64)
    json.dump(c, open(path, "w"), indent=2)


def batch(model_dir):
    """Right-padded ids, attention mask and labels of the whole training set, built as lathe builds them."""
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    eos = json.load(open(os.path.join(model_dir, "config.json")))["eos_token_id"]
    eos = eos[0] if isinstance(eos, list) else eos
    docs = []
    for line in open(os.path.join(ROOT, "data", "sample", "training.jsonl")):
        r = json.loads(line)
        ids = tok.encode(r["input"] + " " + r["output"], add_special_tokens=True).ids
        prompt = tok.encode(r["input"].rstrip(), add_special_tokens=True).ids
        boundary = 0
        while boundary < min(len(ids), len(prompt)) and ids[boundary] == prompt[boundary]:
            boundary += 1
        mask = [0] * boundary + [1] * (len(ids) - boundary)
        if ids[-1] != eos:
            ids, mask = ids + [eos], mask + [1]
        mask[0] = 0
        docs.append((ids[:256], mask[:256]))
    n = max(len(d[0]) for d in docs)
    input_ids = torch.zeros(len(docs), n, dtype=torch.int64)
    attn = torch.zeros(len(docs), n, dtype=torch.int64)
    labels = torch.full((len(docs), n), -100, dtype=torch.int64)
    for b, (ids, mask) in enumerate(docs):
        input_ids[b, :len(ids)] = torch.tensor(ids)
        attn[b, :len(ids)] = 1
        for j, m in enumerate(mask):
            if m:
                labels[b, j] = ids[j]
    return input_ids, attn, labels


def lr_at(step, steps, peak=LR):  # lathe's lr_at, 0-based step
    if step <= WARMUP:
        return peak * (step + 1) / (WARMUP + 1)
    progress = (step - WARMUP) / (steps - WARMUP)
    return MIN_LR + (peak - MIN_LR) * 0.5 * (1 + math.cos(math.pi * progress))


def lathe_init(lathe, model_dir, out):
    """lathe's own adapter initialization (A drawn by lathe, B = 0), read from
    the checkpoint of a one-step CPU run of the job: with B = 0 the first
    step's gradient of every A is exactly zero, so A leaves that step as it
    was drawn (AdamW without weight decay moves nothing with a zero
    gradient); the Bs the step moved are reset to zero here."""
    run = os.path.join(out, "init_run")
    subprocess.run([lathe, "finetune", "--model", model_dir, "--data", os.path.join(ROOT, "data", "sample"),
                    "--recipe", os.path.join(ROOT, "recipes", "tiny_lora.yaml"), "--run-dir", run, "--device", "cpu",
                    "--progress", "lines", "trainer.max_steps=1", "optim.lr=0.01", "optim.sched.warmup_steps=5", "optim.sched.max_steps=30",
                    "checkpoint.every_n_train_steps=1", "checkpoint.monitor=train_loss"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = glob.glob(os.path.join(run, "checkpoints", "step=000001*", "model-rank00000.safetensors"))[0]
    init = {}
    for name, t in safetensors.torch.load_file(ckpt).items():
        peft_name = name.replace(".lora_A.weight", ".lora_A.default.weight").replace(
            ".lora_B.weight", ".lora_B.default.weight")
        init[peft_name] = t.float() if ".lora_A." in name else torch.zeros_like(t, dtype=torch.float32)
    return init


def curve(model_dir, dtype, attn_impl, data, steps, init=None):
    torch.manual_seed(1234)  # the same LoRA A draw in every run
    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn_impl)
    cfg = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=MODULES)
    model = peft.get_peft_model(base, cfg).train()
    if init is not None:
        named = dict(model.named_parameters())
        assert set(init) == {n for n, p in named.items() if p.requires_grad}, "lathe's adapter names differ from PEFT's"
        with torch.no_grad():
            for n, t in init.items():
                named[n].copy_(t)
    params = [p for p in model.parameters() if p.requires_grad]
    assert all(p.dtype == torch.float32 for p in params), "PEFT did not keep LoRA in f32"
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0)
    ids, mask, labels = data
    losses = []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps)
        opt.zero_grad()
        # HF shifts labels inside and averages over every supervised token of the batch.
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        losses.append(loss.item())
    return losses


def full_curve(model_dir, dtype, attn_impl, data, steps):
    """Full SFT: f32 masters; with dtype bf16 each pass runs on a bf16 copy of them."""
    master = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=attn_impl).train()
    work = master
    if dtype != torch.float32:
        work = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=dtype, attn_implementation=attn_impl).train()
    params = list(master.parameters())
    opt = torch.optim.AdamW(params, lr=FULL_LR, betas=BETAS, eps=EPS, weight_decay=0.0)
    ids, mask, labels = data
    losses = []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, FULL_LR)
        opt.zero_grad()
        if work is not master:
            with torch.no_grad():
                for w, p in zip(work.parameters(), params):
                    w.copy_(p)  # rounded to bf16
            work.zero_grad()
        loss = work(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        if work is not master:
            for w, p in zip(work.parameters(), params):
                p.grad = w.grad.float()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lathe", required=True, help="the lathe binary (makes the model with init-model)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--full", action="store_true", help="full-parameter SFT instead of LoRA")
    ap.add_argument("--out", default=None,
                    help="default tests/data/cuda_finetune/bf16_curve_error.json (_full.json with --full)")
    args = ap.parse_args()
    if args.out is None:
        args.out = os.path.join(ROOT, "tests", "data", "cuda_finetune",
                                "bf16_curve_error_full.json" if args.full else "bf16_curve_error.json")
    run = full_curve if args.full else curve
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        make_model(args.lathe, tmp)
        data = batch(tmp)
        extra = () if args.full else (lathe_init(args.lathe, tmp, tmp),)
        f32 = run(tmp, torch.float32, "eager", data, args.steps, *extra)
        runs = {a: run(tmp, torch.bfloat16, a, data, args.steps, *extra) for a in ("sdpa", "eager")}
    err = {a: [round(abs(b - f) / f, 6) for b, f in zip(r, f32)] for a, r in runs.items()}
    what = ("HF full-parameter training, bf16 passes on f32 masters vs f32" if args.full else
            "HF + PEFT LoRA training, base bf16 (LoRA f32) vs f32")
    job = ("recipes/tiny_lora.yaml with peft.peft_scheme=none optim.lr=%g optim.sched.warmup_steps=5" % FULL_LR
           if args.full else "recipes/tiny_lora.yaml with optim.lr=0.01 optim.sched.warmup_steps=5; "
           "adapter initialized as lathe initializes it (A: lathe's draw, B = 0)")
    doc = {"what": what + ": |loss_bf16 - loss_f32| / loss_f32 per step",
           "made_by": "python3 tools/bf16_curve_error.py --lathe LATHE%s --steps %d" % (
               " --full" if args.full else "", args.steps),
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "peft": peft.__version__},
           "job": "tiny preset (seed 1, bf16) at head_dim 64; data/sample/training.jsonl; " + job,
           "step_errors": err["sdpa"], "step_errors_eager": err["eager"],
           "f32_losses": [round(x, 6) for x in f32], "bf16_losses": [round(x, 6) for x in runs["sdpa"]]}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    for s, (f, b, e, ee) in enumerate(zip(f32, runs["sdpa"], err["sdpa"], err["eager"]), 1):
        print(f"step {s:3d}  f32 {f:.5f}  bf16 {b:.5f}  rel {e:.2e}  (eager {ee:.2e})")


if __name__ == "__main__":
    main()
