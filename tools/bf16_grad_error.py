#!/usr/bin/env python3
"""Measures how far Hugging Face + PEFT's own bf16 training step is from its f32 one, per LoRA tensor.

The GPU trainer tests (tests/cuda_train/cuda_train_test.cpp) compare a bf16
pass (bf16 base weights, bf16 GEMMs accumulating in f32, f32 LoRA masters)
against f32 gradients. Their tolerance for each gradient tensor and for the
loss is what transformers + PEFT get on the same model and batch when run the
way their users train in bf16: the base model loaded with dtype=bfloat16 and
the adapter attached by PEFT, which keeps LoRA parameters in f32
(autocast_adapter_dtype, its default) and runs the LoRA branch in f32 on the
bf16 activations. That is the analogue of lathe's GPU path: a bf16 base whose
activations round to bf16 at every layer, and f32 LoRA weights and gradients.
The metric is the test's: max|bf16 - f32| / max|f32| per tensor, and
|Δloss| / loss.

Cases, mirroring the tests (fixtures of tests/data/grad_hd64):
  peft/<family>    the fixture batch of lora_grads.safetensors (two
      sequences, prompt-masked, padded with an attention mask).
  packed/<family>  the test's random_batch(vocab, 17): three documents of
      50, 37 and 20 tokens drawn from std::mt19937(17) as 3 + r % (vocab - 3),
      the first 6 tokens of each unsupervised; HF runs them as a padded batch
      (lathe packs them into one row with per-document positions: the same
      maths).

`error` is with the default attention (sdpa), the tolerance; `eager` is the
same bf16 run with eager attention, recorded to show how much the number moves
between two equally valid bf16 runs. `wrong` is the error of a deliberately
broken f32 run (the documents of the batch attending to each other, as a
packing bug would do), to show the tolerance separates a real bug from bf16
rounding. The f32 run's gradients are checked against the fixture's own.

Full-parameter SFT (--full, written to bf16_error_full.json): the same
measurement for every weight's gradient with no adapter. HF's bf16 step is
the model loaded with dtype=bfloat16 and every parameter trainable, the way
a plain bf16 fine-tune runs: weights and activations bf16 (the analogue of
lathe's bf16 copies the passes read), gradients bf16 too (lathe's are f32:
HF's carry one more rounding, ≤ 2⁻⁹ of each element). Cases full/<family>
on the fixture batch of full_grads.safetensors (its tensors, whose f32 run
is checked against the fixture), full_packed/<family> on the packed batch
(every parameter, under transformers' names). --full also records a third
equally valid bf16 run, `math`: sdpa forced to its MATH backend. The loss is
one scalar whose bf16 error is a sum of per-token errors that mostly cancel,
so a run can land anywhere near zero: on full_packed/llama HF's sdpa and
eager runs are 3.5e-6 and 3.7e-5 from f32 and its math run 2.5e-4; the tests
bound every full-SFT entry by the largest of the three.

Usage: python3 tools/bf16_grad_error.py [--full] [--out tests/data/grad_hd64/bf16_error.json]
Needs torch, transformers, peft, safetensors. Deterministic.
"""
import argparse
import json
import os

import peft
import torch
import transformers
from safetensors.torch import load_file

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "grad_hd64")
FAMILIES = ["llama", "qwen2", "qwen3"]
PACKED_LENGTHS = (50, 37, 20)
PACKED_SEED = 17
PACKED_UNSUPERVISED = 5  # labels[j] (predicting token j + 1) ignored for j < 5


def mt19937(seed):
    """std::mt19937 seeded with one integer: yields its 32-bit outputs."""
    mt = [0] * 624
    mt[0] = seed & 0xFFFFFFFF
    for i in range(1, 624):
        mt[i] = (1812433253 * (mt[i - 1] ^ (mt[i - 1] >> 30)) + i) & 0xFFFFFFFF
    while True:
        for i in range(624):
            y = (mt[i] & 0x80000000) | (mt[(i + 1) % 624] & 0x7FFFFFFF)
            mt[i] = mt[(i + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
        for y in mt:
            y ^= y >> 11
            y ^= (y << 7) & 0x9D2C5680
            y ^= (y << 15) & 0xEFC60000
            yield y ^ (y >> 18)


def padded(docs, supervised_from):
    """Right-padded ids, attention mask and labels (HF's: labels[j] is token j, shifted inside)."""
    L = max(len(d) for d in docs)
    ids = torch.zeros(len(docs), L, dtype=torch.int64)
    mask = torch.zeros(len(docs), L, dtype=torch.int64)
    labels = torch.full((len(docs), L), -100, dtype=torch.int64)
    for b, (d, p) in enumerate(zip(docs, supervised_from)):
        ids[b, :len(d)] = torch.tensor(d)
        mask[b, :len(d)] = 1
        labels[b, p:len(d)] = ids[b, p:len(d)]
    return ids, mask, labels


def packed_batch(vocab):
    r = mt19937(PACKED_SEED)
    docs = [[3 + next(r) % (vocab - 3) for _ in range(n)] for n in PACKED_LENGTHS]
    return padded(docs, [PACKED_UNSUPERVISED + 1] * len(docs))


def fixture_batch(ref):
    ids, labels, lengths = ref["input_ids"], ref["labels"], ref["lengths"].tolist()
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    return ids, mask, labels


def merged(ids, mask, labels):
    """The batch's documents concatenated into one sequence: each attends to the ones before it."""
    keep = mask.bool()
    return ids[keep][None], torch.ones(1, int(keep.sum()), dtype=torch.int64), labels[keep][None]


DEVICE = "cpu"  # --device


def step(family, dtype, attn, batch):
    """Loss and LoRA gradients (f32) of one pass of the fixture model + adapter."""
    path = os.path.join(DATA, family)
    base = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(path, "model"), dtype=dtype, attn_implementation=attn).to(DEVICE)
    model = peft.PeftModel.from_pretrained(base, os.path.join(path, "adapter"), is_trainable=True).train()
    ids, mask, labels = (t.to(DEVICE) for t in batch)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    grads = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.dtype == torch.float32, f"{name} is {p.dtype}: PEFT did not keep LoRA in f32"
            grads[name.replace(".default", "")] = p.grad.detach().double().cpu()
    return loss.item(), grads


def step_full(family, dtype, attn, batch):
    """Loss and every weight's gradient (as f64) of one pass of the fixture model, all of it trainable."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(DATA, family, "model"), dtype=dtype, attn_implementation=attn).to(DEVICE).train()
    ids, mask, labels = (t.to(DEVICE) for t in batch)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    return loss.item(), {n: p.grad.detach().double().cpu() for n, p in model.named_parameters()}


def errors(got, want):
    loss = abs(got[0] - want[0]) / abs(want[0])
    grads = {n: ((got[1][n] - w).abs().max() / w.abs().max()).item() for n, w in want[1].items()}
    return loss, grads


def math_sdpa(run, family, batch):
    """The bf16 run with sdpa forced to its MATH backend: a third equally valid draw."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        return run(family, torch.bfloat16, "sdpa", batch)


def case(family, batch, check_against=None, full=False):
    run = step_full if full else step
    f32 = run(family, torch.float32, "eager", batch)
    if check_against is not None:  # the f32 run is the fixture's reference (full: the tensors it holds)
        if full:
            f32 = (f32[0], {n: g for n, g in f32[1].items() if n in check_against})
        loss, grads = errors(f32, (check_against["loss"].item(),
                                   {n: check_against[n].double() for n in f32[1]}))
        assert loss < 1e-5 and max(grads.values()) < 1e-4, (family, loss, max(grads.values()))
    runs = {a: errors(run(family, torch.bfloat16, a, batch), f32) for a in ("sdpa", "eager")}
    if full:
        runs["math"] = errors(math_sdpa(run, family, batch), f32)
    wrong = errors(run(family, torch.float32, "eager", merged(*batch)), f32)
    out = {"loss": {"error": runs["sdpa"][0], "eager": runs["eager"][0], "wrong": wrong[0]}, "grads": {}}
    for n in f32[1]:
        out["grads"][n] = {"error": runs["sdpa"][1][n], "eager": runs["eager"][1][n], "wrong": wrong[1][n]}
    if full:
        out["loss"]["math"] = runs["math"][0]
        for n in f32[1]:
            out["grads"][n]["math"] = runs["math"][1][n]
    return out


def rounded(c):
    return {k: (round(v, 5) if isinstance(v, float) else rounded(v)) for k, v in c.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="default: bf16_error.json (bf16_error_full.json with --full)")
    ap.add_argument("--full", action="store_true", help="full-parameter SFT: every weight's gradient, no adapter")
    ap.add_argument("--device", default="cpu",
                    help="where HF runs (cuda: HF's own bf16 error on a GPU, for comparison; the tests' "
                         "tolerances come from the cpu run); f32 matmuls stay full f32 (no TF32)")
    args = ap.parse_args()
    if args.out is None:
        args.out = os.path.join(DATA, "bf16_error_full.json" if args.full else "bf16_error.json")
    global DEVICE
    DEVICE = args.device
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    torch.set_num_threads(1)  # reproducible reductions
    cases = {}
    fixture, names = ("full_grads", ("full", "full_packed")) if args.full else ("lora_grads", ("peft", "packed"))
    for fam in FAMILIES:
        ref = load_file(os.path.join(DATA, fam, fixture + ".safetensors"))
        cases[f"{names[0]}/{fam}"] = rounded(case(fam, fixture_batch(ref), ref, args.full))
        vocab = transformers.AutoConfig.from_pretrained(os.path.join(DATA, fam, "model")).vocab_size
        cases[f"{names[1]}/{fam}"] = rounded(case(fam, packed_batch(vocab), None, args.full))
    what = ("HF bf16 full-parameter training step (model loaded in bf16, every weight trainable) vs f32: "
            "max|diff| / max|ref| per weight gradient, |diff| / loss for the loss" if args.full else
            "HF + PEFT bf16 training step (base bf16, LoRA f32) vs f32: max|diff| / max|ref| "
            "per LoRA gradient, |diff| / loss for the loss")
    doc = {"what": what,
           "made_by": "python3 tools/bf16_grad_error.py" + (" --full" if args.full else "") +
                      ("" if DEVICE == "cpu" else f" --device {DEVICE}"),
           "device": DEVICE if DEVICE == "cpu" else f"{DEVICE} ({torch.cuda.get_device_name()})",
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "peft": peft.__version__},
           "attn_implementation": "error: sdpa (the default); eager: eager, for comparison",
           "wrong": "f32 with the batch's documents attending to each other",
           "cases": cases}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    for name, c in cases.items():
        print(f"{name:14s} loss {c['loss']['error']:.5f} (eager {c['loss']['eager']:.5f}, wrong {c['loss']['wrong']:.4f})")
        for n, g in c["grads"].items():
            print(f"  {n:58s} {g['error']:.4f} (eager {g['eager']:.4f}) wrong {g['wrong']:.3f}")


if __name__ == "__main__":
    main()
