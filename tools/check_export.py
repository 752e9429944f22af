#!/usr/bin/env python3
"""Checks `lathe export` against the real Hugging Face libraries.

  tools/check_export.py --lathe build/bin/lathe --base BASE_DIR \
      --hf EXPORTED_HF_DIR --peft EXPORTED_PEFT_DIR [--max-rel 1e-4]

Loads the `hf` export with transformers (AutoModelForCausalLM, float32, eager
attention) and the `hf-peft` export with PEFT on the base model
(PeftModel.from_pretrained, unmerged), computes float32 logits of a few
prompts (the base model's tokenizer on sample questions), and compares:

  lathe logits --model HF            vs transformers on HF
  lathe logits --model BASE --adapter PEFT
                                     vs PEFT on BASE
  transformers on HF                 vs PEFT on BASE   (the merge itself)

plus every merged weight of HF against PEFT's merge_and_unload() in the
exported dtype. The error is max|a - b| / max|b| over all logits (or per tensor
for weights). Exits 1 when a lathe-vs-library comparison passes --max-rel; with
a float32 export also when the merged model differs from the unmerged PEFT
model by more than that, or a merged weight by more than 1e-6; with a bf16/f16
export when a merged weight is more than one unit in the last place from
PEFT's (PEFT rounds the update and then the sum, lathe the sum once).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from peft import PeftModel
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

PROMPTS = [
    "What is the daily ATM withdrawal limit?",
    "지점 영업시간은 어떻게 되나요?",
    "How do I report a lost card?",
    "남산 적금의 금리는 얼마인가요?",
]


def prompt_ids(base):
    tok = Tokenizer.from_file(os.path.join(base, "tokenizer.json"))
    rows = [tok.encode(p, add_special_tokens=True).ids for p in PROMPTS]
    n = min(len(r) for r in rows)  # `lathe logits` takes rows of one length
    return np.array([r[:n] for r in rows], dtype=np.int64)


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.float().numpy()


def lathe_logits(lathe, ids, model, adapter=None):
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "ids.safetensors"), os.path.join(tmp, "logits.safetensors")
        save_file({"input_ids": ids}, src)
        cmd = [lathe, "logits", "--model", model, "--input-ids", src, "--out", out]
        if adapter:
            cmd += ["--adapter", adapter]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return load_file(out)["logits"]


def rel(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def load(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lathe", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--hf", required=True)
    ap.add_argument("--peft", required=True)
    ap.add_argument("--max-rel", type=float, default=1e-4)
    ap.add_argument("--json", help="also write the numbers to this file")
    args = ap.parse_args()

    ids = prompt_ids(args.base)
    merged = load(args.hf)
    peft = PeftModel.from_pretrained(load(args.base), args.peft).eval()
    ref_hf, ref_peft = hf_logits(merged, ids), hf_logits(peft, ids)
    results = {
        "prompts": int(ids.shape[0]),
        "tokens_per_prompt": int(ids.shape[1]),
        "lathe_hf_vs_transformers": rel(lathe_logits(args.lathe, ids, args.hf), ref_hf),
        "lathe_adapter_vs_peft": rel(lathe_logits(args.lathe, ids, args.base, args.peft), ref_peft),
        "transformers_hf_vs_peft": rel(ref_hf, ref_peft),
    }
    config = json.load(open(os.path.join(args.hf, "config.json")))
    dtype = config.get("dtype", config.get("torch_dtype", "float32"))
    exported_f32 = dtype == "float32"
    results["exported_dtype"] = dtype
    # The merged weights against PEFT's own merge_and_unload, tensor by
    # tensor, both in the exported dtype (PEFT merges a bf16 base in bf16).
    if exported_f32:
        theirs_model = peft.merge_and_unload()
    else:
        native = AutoModelForCausalLM.from_pretrained(args.base, dtype=getattr(torch, dtype))
        theirs_model = PeftModel.from_pretrained(native, args.peft).merge_and_unload()
        merged_native = AutoModelForCausalLM.from_pretrained(args.hf, dtype=getattr(torch, dtype))
    ours_model = merged if exported_f32 else merged_native
    theirs = {k: v.float().numpy() for k, v in theirs_model.state_dict().items()}
    ours = {k: v.float().numpy() for k, v in ours_model.state_dict().items()}
    assert ours.keys() == theirs.keys(), sorted(set(ours) ^ set(theirs))
    worst = max(((rel(ours[k], theirs[k]), k) for k in ours), key=lambda t: t[0])
    results["weights_vs_merge_and_unload"] = worst[0]
    results["weights_worst_tensor"] = worst[1]
    if not exported_f32:
        # In units of the dtype's spacing at each value (bf16: 8 bits of mantissa).
        bits = 8 if dtype == "bfloat16" else 11
        ulps, same, total = 0.0, 0, 0
        for k in ours:
            a, b = ours[k], theirs[k]
            spacing = np.exp2(np.floor(np.log2(np.maximum(np.abs(b), 1e-30))) - (bits - 1))
            ulps = max(ulps, float(np.max(np.abs(a - b) / spacing)))
            same += int(np.sum(a == b))
            total += a.size
        results["weights_max_ulps"] = ulps
        results["weights_identical_fraction"] = same / total
    lora_b = [v for k, v in load_file(os.path.join(args.peft, "adapter_model.safetensors")).items() if "lora_B" in k]
    results["max_abs_lora_B"] = float(max(np.max(np.abs(b)) for b in lora_b))

    for k, v in results.items():
        print(f"{k:30s} {v:.6g}" if isinstance(v, float) else f"{k:30s} {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if results["max_abs_lora_B"] == 0:
        print("FAIL: every lora_B is zero; train more steps so the adapter changes the model")
        return 1
    # lathe against the libraries on the same weights always; the merged
    # model against the unmerged adapter only in float32 (a bf16 or f16 export
    # is rounded once more, to the dtype's precision).
    checks = ["lathe_hf_vs_transformers", "lathe_adapter_vs_peft"]
    if exported_f32:
        checks.append("transformers_hf_vs_peft")
    bad = [k for k in checks if results[k] > args.max_rel]
    if exported_f32 and results["weights_vs_merge_and_unload"] > 1e-6:
        bad.append("weights_vs_merge_and_unload")
    if not exported_f32 and results["weights_max_ulps"] > 1.0:
        bad.append("weights_max_ulps")
    if bad:
        print(f"FAIL: {', '.join(bad)} above the limit")
        return 1
    print(f"ok: {', '.join(checks)} within {args.max_rel:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
