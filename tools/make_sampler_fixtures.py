#!/usr/bin/env python3
"""Reference data for lathe's sampler: runs Hugging Face transformers' own
logits processors and warpers (RepetitionPenalty, Temperature, TopK, TopP,
MinP, in generate()'s order) on random logits and records which tokens
survive and their probabilities.

Writes tests/data/engine/sampler_warpers.json. Run from the repository root:
    python3 tools/make_sampler_fixtures.py
"""
import json
import os

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

CASES = [
    dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0),
    dict(temperature=0.7, top_k=10, top_p=1.0, min_p=0.0, repetition_penalty=1.0),
    dict(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0, repetition_penalty=1.0),
    dict(temperature=1.3, top_k=0, top_p=0.5, min_p=0.0, repetition_penalty=1.0),
    dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.1, repetition_penalty=1.0),
    dict(temperature=0.8, top_k=20, top_p=0.8, min_p=0.05, repetition_penalty=1.3),
    dict(temperature=1.0, top_k=5, top_p=0.95, min_p=0.0, repetition_penalty=1.1),
    dict(temperature=2.0, top_k=0, top_p=0.7, min_p=0.2, repetition_penalty=0.8),
]


def run_case(gen, params, vocab):
    logits = (torch.randn(vocab, generator=gen) * 3.0).float()
    context = torch.randint(0, vocab, (12,), generator=gen)
    procs = LogitsProcessorList()
    if params["repetition_penalty"] != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(params["repetition_penalty"]))
    procs.append(TemperatureLogitsWarper(params["temperature"]))
    if params["top_k"] > 0:
        procs.append(TopKLogitsWarper(params["top_k"]))
    if params["top_p"] < 1.0:
        procs.append(TopPLogitsWarper(params["top_p"]))
    if params["min_p"] > 0.0:
        procs.append(MinPLogitsWarper(params["min_p"]))
    scores = procs(context[None, :], logits[None, :].clone())[0]
    probs = torch.softmax(scores.double(), dim=-1)
    kept = [i for i in range(vocab) if scores[i].item() != float("-inf")]
    return {
        **params,
        "logits": [float(x) for x in logits.tolist()],
        "context": [int(x) for x in context.tolist()],
        "kept_ids": kept,
        "kept_probs": [float(probs[i]) for i in kept],
    }


def main():
    gen = torch.Generator().manual_seed(1234)
    out = []
    for params in CASES:
        for vocab in (50, 300):
            out.append(run_case(gen, params, vocab))
    path = os.path.join("tests", "data", "engine", "sampler_warpers.json")
    with open(path, "w") as f:
        json.dump({"made_by": "tools/make_sampler_fixtures.py", "cases": out}, f)
    print(f"wrote {len(out)} cases to {path}")


if __name__ == "__main__":
    main()
