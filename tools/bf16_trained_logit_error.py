#!/usr/bin/env python3
"""Hugging Face's own bf16 logit error on the model that cuda_finetune_e2e.sh trains.

tests/cli/cuda_finetune_e2e.sh compares the GPU's logits with the CPU's on
the tiny head_dim-64 model after its LoRA run has memorized data/sample: a
model with sharp logits (max|z| about 15), whose bf16 error is larger than a
random model's. The tolerance is what transformers gets on that same model:
the adapter merged in f32 by PEFT, then the merged model cast to bfloat16
(weights and compute, as lathe's GPU holds the merged weights in bf16),
against the f32 merged model, on every record of data/sample/test.jsonl
tokenized as the script tokenizes it (input + " " + output, with the
tokenizer's special tokens). Per record: max|z_bf16 − z_f32| / max|z_f32|.

The adapter comes from lathe's CPU trainer with the script's recipe (30
steps, lr 1e-2, 5 warmup steps; the CPU run is the f32 reference, and a run
on another machine differs from this one only in floating-point summation
order). `error` is the default (sdpa) attention, `error_eager` eager.

The same runs give the script's eval tolerance: the token-weighted mean loss
over the records' supervised tokens (the answer and EOS, as lathe eval builds
{input, output} records), `loss_error` = |loss_bf16 − loss_f32| / loss_f32
(sdpa; `loss_error_eager` eager).

Usage: python3 tools/bf16_trained_logit_error.py --lathe build/bin/lathe
         [--out tests/data/cuda_finetune/bf16_trained_logit_error.json]
Needs torch, transformers, peft, tokenizers.
"""
import argparse
import json
import os
import subprocess
import tempfile

import peft
import torch
import transformers
from tokenizers import Tokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
RECIPE = ["trainer.max_steps=30", "trainer.log_every_n_steps=1", "trainer.val_check_interval=10",
          "optim.lr=0.01", "optim.sched.warmup_steps=5"]


def train(lathe, tmp):
    """The script's model and its CPU-trained adapter."""
    model = os.path.join(tmp, "tiny64")
    subprocess.run([lathe, "init-model", "--preset", "tiny", "--out", model, "--seed", "1", "--dtype", "bf16"],
                   check=True, stdout=subprocess.DEVNULL)
    path = os.path.join(model, "config.json")
    c = json.load(open(path))
    c.update(num_attention_heads=2, num_key_value_heads=1, head_dim=64)
    json.dump(c, open(path, "w"), indent=2)
    run = os.path.join(tmp, "cpu")
    subprocess.run([lathe, "finetune", "--model", model, "--data", os.path.join(ROOT, "data", "sample"),
                    "--recipe", os.path.join(ROOT, "recipes", "tiny_lora.yaml"), "--run-dir", run,
                    "--progress", "lines", "--device", "cpu"] + RECIPE,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return model, os.path.join(run, "adapter")


def merged(model_dir, adapter, attn):
    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                             attn_implementation=attn)
    return peft.PeftModel.from_pretrained(base, adapter).merge_and_unload().eval()


def supervised(tok, eos, r):
    """lathe's {input, output} example: ids with EOS, and which positions are targets."""
    ids = tok.encode(r["input"] + " " + r["output"], add_special_tokens=True).ids
    prompt = tok.encode(r["input"].rstrip(), add_special_tokens=True).ids
    b = 0
    while b < min(len(ids), len(prompt)) and ids[b] == prompt[b]:
        b += 1
    mask = [0] * b + [1] * (len(ids) - b)
    if ids[-1] != eos:
        ids, mask = ids + [eos], mask + [1]
    mask[0] = 0
    return ids, mask


def mean_loss(model, examples):
    total, n = 0.0, 0
    for ids, mask in examples:
        z = model(input_ids=torch.tensor([ids])).logits[0].double()
        lp = torch.log_softmax(z[:-1], dim=-1)
        for i in range(1, len(ids)):
            if mask[i]:
                total -= lp[i - 1, ids[i]].item()
                n += 1
    return total / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lathe", required=True)
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "cuda_finetune",
                                                  "bf16_trained_logit_error.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, adapter = train(args.lathe, tmp)
        tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        records = [json.loads(l) for l in open(os.path.join(ROOT, "data", "sample", "test.jsonl"))]
        ids = [tok.encode(r["input"] + " " + r["output"], add_special_tokens=True).ids for r in records]
        eos = json.load(open(os.path.join(model_dir, "config.json")))["eos_token_id"]
        examples = [supervised(tok, eos[0] if isinstance(eos, list) else eos, r) for r in records]
        ref = merged(model_dir, adapter, "eager")
        err, max_z, loss_err = {"sdpa": [], "eager": []}, [], {}
        with torch.no_grad():
            want = [ref(input_ids=torch.tensor([x])).logits[0].double() for x in ids]
            max_z = [w.abs().max().item() for w in want]
            loss_f32 = mean_loss(ref, examples)
            for attn in err:
                m = merged(model_dir, adapter, attn).to(torch.bfloat16)
                for x, w in zip(ids, want):
                    got = m(input_ids=torch.tensor([x])).logits[0].double()
                    err[attn].append(round(((got - w).abs().max() / w.abs().max()).item(), 5))
                loss_err[attn] = round(abs(mean_loss(m, examples) - loss_f32) / loss_f32, 6)
    doc = {"what": "HF bf16 (adapter merged in f32, then cast; weights and compute bf16) vs f32 logits of the "
                   "trained tiny head_dim-64 model, max|diff| / max|ref| per data/sample/test.jsonl record",
           "made_by": "python3 tools/bf16_trained_logit_error.py --lathe LATHE",
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "peft": peft.__version__},
           "error": err["sdpa"], "error_eager": err["eager"], "max_abs_logit": [round(z, 4) for z in max_z],
           "loss_f32": round(loss_f32, 6), "loss_error": loss_err["sdpa"], "loss_error_eager": loss_err["eager"]}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    for k, (a, b, z) in enumerate(zip(err["sdpa"], err["eager"], max_z)):
        print(f"record {k}: sdpa {a:.5f}  eager {b:.5f}  max|z| {z:.3f}")
    print(f"loss f32 {loss_f32:.6f}: bf16 error sdpa {loss_err['sdpa']:.6f}  eager {loss_err['eager']:.6f}")


if __name__ == "__main__":
    main()
