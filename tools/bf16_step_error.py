#!/usr/bin/env python3
"""How far ONE bf16 LoRA training step of Hugging Face + PEFT lands from its
f32 step, taken from the same state: the per-step bound of
tests/cli/cuda_finetune_e2e.sh.

The e2e's loss curves run free, so early rounding compounds (this job's bf16
curves drift several percent from f32, see tools/bf16_curve_error.py) and a
curve bound has to be wide. A step taken from a given state does not
compound: the e2e restores the CPU run's checkpoint after step k on the GPU,
takes step k + 1 there, and compares the update ΔW = W(k+1) − W(k) of every
LoRA tensor with the CPU's own step k + 1. This tool measures the same thing
for the reference stack: from lathe's CPU checkpoint k (adapter weights and
AdamW moments, which map one to one onto PEFT's parameters and
torch.optim.AdamW's state), transformers + PEFT take step k + 1 in f32 and
in bf16 (base in bfloat16, adapter kept in f32: sdpa and eager attention,
two equally valid draws), and per tensor

    error = ‖ΔW_bf16 − ΔW_f32‖ / ‖ΔW_f32‖.

The job is the e2e's (tools/bf16_curve_error.py: tiny preset at head_dim 64,
data/sample, recipes/tiny_lora.yaml with lr 1e-2 and 5 warmup steps, global
batch = the whole set, AdamW betas (0.9, 0.98), eps 1e-5, clip 1). HF's f32
step is also compared with lathe's CPU step (`f32_vs_lathe`, per k the
largest tensor error): it must be ~1e-6, which checks that the state and the
step are the same ones.

Usage: python3 tools/bf16_step_error.py --lathe build/bin/lathe
         [--out tests/data/cuda_finetune/bf16_step_error.json]
Needs torch, transformers, peft, tokenizers, safetensors. One thread.
"""
import argparse
import glob
import json
import os
import subprocess
import tempfile

import peft
import safetensors.torch
import torch
import transformers

import bf16_curve_error as job

STEPS = 30
KS = [1, 2, 3, 5, 8, 12, 16, 20, 25]  # states the step is taken from (after step k)


def lathe_cpu_run(lathe, model_dir, run_dir):
    """The e2e's CPU run with a checkpoint after every step."""
    subprocess.run([lathe, "finetune", "--model", model_dir, "--data", os.path.join(job.ROOT, "data", "sample"),
                    "--recipe", os.path.join(job.ROOT, "recipes", "tiny_lora.yaml"), "--run-dir", run_dir,
                    "--device", "cpu", "--progress", "lines", "trainer.max_steps=%d" % (max(KS) + 1),
                    "optim.lr=0.01", "optim.sched.warmup_steps=5", "optim.sched.max_steps=%d" % STEPS,
                    "trainer.val_check_interval=10", "checkpoint.every_n_train_steps=1",
                    "checkpoint.save_top_k=-1", "checkpoint.monitor=train_loss"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def load_state(run_dir, k):
    d = glob.glob(os.path.join(run_dir, "checkpoints", "step=%06d*" % k))[0]
    weights = safetensors.torch.load_file(os.path.join(d, "model-rank00000.safetensors"))
    moments = safetensors.torch.load_file(os.path.join(d, "optim-rank00000.safetensors"))
    return ({n: t.float() for n, t in weights.items()},
            {n: t.float() for n, t in moments.items() if t.dtype == torch.float32})


def peft_name(name):
    return name.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")


def one_step(model_dir, dtype, attn_impl, data, weights, moments, k):
    """Step k + 1 from lathe's state after step k; returns the new adapter by lathe's names."""
    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn_impl)
    cfg = peft.LoraConfig(r=job.RANK, lora_alpha=job.ALPHA, lora_dropout=0.0, target_modules=job.MODULES)
    model = peft.get_peft_model(base, cfg).train()
    named = dict(model.named_parameters())
    params = []
    with torch.no_grad():
        for n, t in weights.items():
            p = named[peft_name(n)]
            assert p.requires_grad and p.dtype == torch.float32 and p.shape == t.shape, n
            p.copy_(t)
            params.append((n, p))
    assert len(params) == sum(p.requires_grad for p in model.parameters()), "not every trainable tensor restored"
    opt = torch.optim.AdamW([p for _, p in params], lr=job.lr_at(k, STEPS), betas=job.BETAS, eps=job.EPS,
                            weight_decay=0.0)
    for n, p in params:
        opt.state[p] = {"step": torch.tensor(float(k)), "exp_avg": moments[n + ".exp_avg"].clone(),
                        "exp_avg_sq": moments[n + ".exp_avg_sq"].clone()}
    ids, mask, labels = data
    opt.zero_grad()
    model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    torch.nn.utils.clip_grad_norm_([p for _, p in params], job.CLIP)
    opt.step()
    return {n: p.detach().clone() for n, p in params}


def update_errors(before, after, ref):
    """Per tensor ‖(after − before) − (ref − before)‖ / ‖ref − before‖, by name."""
    out = {}
    for n, w0 in before.items():
        dref = ref[n] - w0
        norm = dref.norm().item()
        if norm > 0:
            out[n] = ((after[n] - w0) - dref).norm().item() / norm
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lathe", required=True, help="the lathe binary (model, CPU run and checkpoints)")
    ap.add_argument("--out", default=os.path.join(job.ROOT, "tests", "data", "cuda_finetune", "bf16_step_error.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    doc = {"what": "HF + PEFT one LoRA step from lathe's CPU state after step k, base bf16 (LoRA f32) vs f32: "
                   "per tensor ||dW_bf16 - dW_f32|| / ||dW_f32||, dW = W(k+1) - W(k)",
           "made_by": "python3 tools/bf16_step_error.py --lathe LATHE",
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "peft": peft.__version__},
           "job": "tiny preset (seed 1, bf16) at head_dim 64; data/sample/training.jsonl; recipes/tiny_lora.yaml "
                  "with optim.lr=0.01 optim.sched.warmup_steps=5, 30 steps",
           "steps": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, run_dir = os.path.join(tmp, "model"), os.path.join(tmp, "run")
        job.make_model(args.lathe, model_dir)
        data = job.batch(model_dir)
        lathe_cpu_run(args.lathe, model_dir, run_dir)
        for k in KS:
            w0, moments = load_state(run_dir, k)
            w_lathe, _ = load_state(run_dir, k + 1)
            f32 = one_step(model_dir, torch.float32, "eager", data, w0, moments, k)
            check = max(update_errors(w0, f32, w_lathe).values())
            runs = {a: update_errors(w0, one_step(model_dir, torch.bfloat16, a, data, w0, moments, k), f32)
                    for a in ("sdpa", "eager")}
            doc["steps"][str(k)] = {"f32_vs_lathe": check,
                                    "sdpa": {n: round(e, 6) for n, e in sorted(runs["sdpa"].items())},
                                    "eager": {n: round(e, 6) for n, e in sorted(runs["eager"].items())}}
            med = {a: sorted(r.values())[len(r) // 2] for a, r in runs.items()}
            print(f"k {k:2d}  f32 vs lathe {check:.1e}  median sdpa {med['sdpa']:.4f}  eager {med['eager']:.4f}  "
                  f"max sdpa {max(runs['sdpa'].values()):.4f}  eager {max(runs['eager'].values()):.4f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
