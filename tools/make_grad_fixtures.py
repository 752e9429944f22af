#!/usr/bin/env python3
"""Writes reference losses and gradients for lathe's training math.

On the tiny models of tests/data/models (made by make_model_fixtures.py) this
runs one forward/backward with transformers + PEFT in float32 (eager
attention) on a prompt-masked batch of two sequences of different lengths
(right-padded, attention_mask, labels -100 on prompt and padding tokens; the
loss is transformers' mean over supervised tokens) and saves:

  <out>/<family>/adapter/          LoRA r=4, alpha=8, dropout 0 on q/k/v/o/gate/
                                   up/down_proj, A from PEFT's default init, B
                                   set to N(0, 0.1) so A's gradients are not
                                   zero (save_pretrained: adapter_config.json +
                                   adapter_model.safetensors); qwen3 uses rsLoRA
  <out>/<family>/lora_grads.safetensors
                                   input_ids [2, L] i64, labels [2, L] i64,
                                   lengths [2] i64, loss [] f64, and the
                                   gradient of every lora_A / lora_B under the
                                   adapter's own key names
  <out>/<family>/full_grads.safetensors   (full-parameter SFT)
                                   the same batch and loss, and the gradients of
                                   the embedding, norms, projections (with a
                                   bias on qwen2, the q/k norm on qwen3) and
                                   the LM head (tied to the embedding on
                                   llama) under transformers' names

Usage: python3 tools/make_grad_fixtures.py [--models tests/data/models] [--out tests/data/grad]
Needs torch, transformers, peft, safetensors. Deterministic for a given seed.
"""
import argparse
import os

import peft
import torch
import transformers
from safetensors.torch import save_file

LENGTHS = (12, 9)
PROMPT = (4, 3)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FAMILIES = {"llama": dict(rslora=False, full=[  # tied: the embedding's gradient includes the LM head's
                "model.embed_tokens.weight", "model.layers.0.self_attn.v_proj.weight",
                "model.layers.1.mlp.up_proj.weight", "model.norm.weight"]),
            "qwen2": dict(rslora=False, full=[
                "model.embed_tokens.weight", "model.layers.1.input_layernorm.weight",
                "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.bias",
                "model.layers.1.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight"]),
            "qwen3": dict(rslora=True, full=[
                "model.embed_tokens.weight", "model.layers.0.post_attention_layernorm.weight",
                "model.layers.0.self_attn.k_norm.weight", "model.layers.1.self_attn.o_proj.weight",
                "model.layers.1.mlp.gate_proj.weight", "lm_head.weight"])}


def load(path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager").train()


def batch(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    L = max(LENGTHS)
    ids = torch.zeros(2, L, dtype=torch.int64)
    mask = torch.zeros(2, L, dtype=torch.int64)
    labels = torch.full((2, L), -100, dtype=torch.int64)
    for b, (n, p) in enumerate(zip(LENGTHS, PROMPT)):
        ids[b, :n] = torch.randint(3, vocab, (n,), generator=g)
        mask[b, :n] = 1
        labels[b, p:n] = ids[b, p:n]
    return ids, mask, labels


def lora_case(family, spec, model_dir, out, seed):
    torch.manual_seed(seed)
    model = load(model_dir)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS,
                          use_rslora=spec["rslora"], task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.1)
    model.peft_config["default"].base_model_name_or_path = f"tests/data/models/{family}"
    model.save_pretrained(os.path.join(out, "adapter"))
    os.remove(os.path.join(out, "adapter", "README.md"))  # PEFT's generated model card
    ids, mask, labels = batch(model.config.vocab_size, seed + 1)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    tensors = {"input_ids": ids, "labels": labels, "lengths": torch.tensor(LENGTHS, dtype=torch.int64),
               "loss": loss.detach().double().reshape([])}
    for name, p in model.named_parameters():
        if p.requires_grad:
            tensors[name.replace(".default", "")] = p.grad.detach().float().contiguous()
    save_file(tensors, os.path.join(out, "lora_grads.safetensors"))
    return loss.item()


def full_case(spec, model_dir, out, seed):
    model = load(model_dir)
    ids, mask, labels = batch(model.config.vocab_size, seed + 1)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    params = dict(model.named_parameters())
    tensors = {"input_ids": ids, "labels": labels, "lengths": torch.tensor(LENGTHS, dtype=torch.int64),
               "loss": loss.detach().double().reshape([])}
    for name in spec["full"]:
        tensors[name] = params[name].grad.detach().float().contiguous()
    save_file(tensors, os.path.join(out, "full_grads.safetensors"))
    return loss.item()


def main():
    here = os.path.dirname(__file__)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=os.path.join(here, "..", "tests", "data", "models"))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "grad"))
    ap.add_argument("--seed", type=int, default=4321)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")
    for i, (family, spec) in enumerate(FAMILIES.items()):
        out = os.path.join(args.out, family)
        os.makedirs(out, exist_ok=True)
        model_dir = os.path.join(args.models, family)
        msg = f"{family}: lora loss {lora_case(family, spec, model_dir, out, args.seed + 10 * i):.6f}"
        if spec["full"]:
            msg += f", full loss {full_case(spec, model_dir, out, args.seed + 10 * i):.6f}"
        print(msg)


if __name__ == "__main__":
    main()
