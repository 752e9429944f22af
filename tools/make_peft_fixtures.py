#!/usr/bin/env python3
"""Writes PEFT LoRA adapters for the tiny llama fixture and the logits they give.

For each variant this wraps tests/data/models/llama with peft.get_peft_model,
randomizes lora_B (peft starts it at zero, which would make the adapter a
no-op), saves the adapter with save_pretrained under
tests/data/adapters/<name>/, and records the logits of the PEFT model itself
(adapter unmerged, eval mode, float32, eager attention) for fixed input ids:
  reference.safetensors  input_ids [1, 10] i64, logits [1, 10, vocab] f32
  greedy.json            {"prompt": the same ids, "continuation": 12 tokens
                         of greedy decoding (argmax each step, EOS ignored),
                         "min_top2_gap": the smallest gap between the two best
                         logits over those steps}

Variants:
  llama-lora    r 4, alpha 8, target_modules a list of all seven projections
  llama-rslora  r 8, alpha 16, use_rslora, target_modules a regular
                expression (q_proj, v_proj, down_proj)

Usage: python3 tools/make_peft_fixtures.py [--model tests/data/models/llama]
       [--out tests/data/adapters]
Needs torch, transformers, peft, safetensors. Deterministic for a given seed.
"""
import argparse
import json
import os

import peft
import torch
import transformers
from safetensors.torch import save_file

VARIANTS = {
    "llama-lora": dict(r=4, lora_alpha=8, use_rslora=False,
                       target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                       "gate_proj", "up_proj", "down_proj"]),
    "llama-rslora": dict(r=8, lora_alpha=16, use_rslora=True,
                         target_modules=r".*\.(q_proj|v_proj|down_proj)"),
}
INPUT_IDS = [[1, 17, 250, 33, 99, 4, 381, 120, 64, 7]]
GREEDY_TOKENS = 12


def make(model_dir, out_dir, name, kwargs, seed):
    torch.manual_seed(seed)
    base = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    cfg = peft.LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, bias="none", **kwargs)
    model = peft.get_peft_model(base, cfg)
    with torch.no_grad():
        for mod_name, p in model.named_parameters():
            if "lora_B" in mod_name:
                p.copy_(torch.randn_like(p) * 0.2)
            elif "lora_A" in mod_name:
                p.copy_(torch.randn_like(p) * 0.2)
    model.eval()
    dest = os.path.join(out_dir, name)
    model.save_pretrained(dest)
    os.remove(os.path.join(dest, "README.md"))  # peft's model card; not a fixture
    ids = torch.tensor(INPUT_IDS, dtype=torch.int64)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float().contiguous()
    save_file({"input_ids": ids, "logits": logits}, os.path.join(dest, "reference.safetensors"))
    seq, gap = ids, float("inf")
    with torch.no_grad():
        for _ in range(GREEDY_TOKENS):
            last = model(input_ids=seq).logits[0, -1].float()
            top2 = torch.topk(last, 2).values
            gap = min(gap, float(top2[0] - top2[1]))
            seq = torch.cat([seq, last.argmax().view(1, 1)], dim=1)
    with open(os.path.join(dest, "greedy.json"), "w") as f:
        json.dump({"prompt": INPUT_IDS[0], "continuation": seq[0, ids.shape[1]:].tolist(), "min_top2_gap": gap}, f)
        f.write("\n")
    print(f"{dest}: logits {tuple(logits.shape)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tests/data/models/llama")
    ap.add_argument("--out", default="tests/data/adapters")
    ap.add_argument("--seed", type=int, default=4321)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for i, (name, kwargs) in enumerate(VARIANTS.items()):
        make(args.model, args.out, name, kwargs, args.seed + i)


if __name__ == "__main__":
    main()
