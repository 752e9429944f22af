#!/usr/bin/env python3
"""Writes the `lathe eval` fixtures: a tokenizer for the tiny llama model, a
small {input, output} test set, and what evaluation must report.

  tests/data/eval/tokenizer/  tokenizer.json (byte-level BPE trained with the
                              tokenizers library on the records, vocabulary
                              under the model's 384; <pad> 0, <s> 1, </s> 2 as
                              the model's config; BOS added by the
                              post-processor) and tokenizer_config.json
  tests/data/eval/test.jsonl  English and Korean records
  tests/data/eval/expected.json
      {"base": {...}, "adapted": {...}} for tests/data/models/llama without
      and with tests/data/adapters/llama-lora (PEFT, unmerged): loss (mean
      negative log-likelihood over the supervised tokens, float64 over
      float32 logits), perplexity, exact_match, f1, n_records, predictions
      (transformers' greedy generate, MAX_NEW tokens, stopping at </s>)

The supervised tokens follow lathe's rule for the "{input} {output}" template:
the whole text with BOS plus EOS, targets after its longest common prefix with
the tokens of the prompt trimmed of trailing whitespace (so the separator
space is a target and generation starts from the bare input). Exact match and F1 use the normalization `lathe eval
--help` states (lowercase, punctuation and whitespace out), written here again
with Python's unicodedata.

Usage: python3 tools/make_eval_fixtures.py
Needs torch, transformers, peft, tokenizers.
"""
import json
import math
import os
import unicodedata
from collections import Counter

import peft
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

MODEL = "tests/data/models/llama"
ADAPTER = "tests/data/adapters/llama-lora"
OUT = "tests/data/eval"
MAX_NEW = 8
RECORDS = [
    {"input": "What is the capital of France?", "output": "Paris"},
    {"input": "2 + 2 =", "output": "4"},
    {"input": "Name a primary colour.", "output": "Red, or blue."},
    {"input": "한국의 수도는?", "output": "서울입니다."},
    {"input": "Translate 'cat' to Korean:", "output": "고양이"},
    {"input": "Say hello.", "output": "Hello, world!"},
]


def build_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=380, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = [r["input"] + " " + r["output"] for r in RECORDS] * 4
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    assert tok.token_to_id("<s>") == 1 and tok.token_to_id("</s>") == 2 and tok.get_vocab_size() <= 384
    return tok


def normalize(s):
    out = []
    for ch in s.lower():
        cat = unicodedata.category(ch)
        out.append(" " if ch.isspace() or cat.startswith("P") or (ord(ch) < 128 and cat.startswith("S")) else ch)
    return " ".join("".join(out).split())


def f1(pred, ref):
    p, r = normalize(pred).split(), normalize(ref).split()
    if not p or not r:
        return float(p == r)
    common = sum((Counter(p) & Counter(r)).values())
    if common == 0:
        return 0.0
    prec, rec = common / len(p), common / len(r)
    return 2 * prec * rec / (prec + rec)


def example(tok, rec):
    prompt = rec["input"] + " "
    full = tok.encode(prompt + rec["output"]).ids + [2]
    p = tok.encode(prompt.rstrip(" \t\r\n\f\v")).ids
    k = 0
    while k < min(len(p), len(full)) and p[k] == full[k]:
        k += 1
    return full, k


def evaluate(model, tok):
    nll, n, em, f1s, preds = 0.0, 0, 0.0, 0.0, []
    for rec in RECORDS:
        full, k = example(tok, rec)
        ids = torch.tensor([full])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
            for i in range(k, len(full)):
                nll -= logp[i - 1, full[i]].item()
                n += 1
            gen = model.generate(input_ids=ids[:, :k], attention_mask=torch.ones_like(ids[:, :k]),
                                 max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=2, pad_token_id=0)
        new = [t for t in gen[0, k:].tolist()]
        if 2 in new:
            new = new[:new.index(2)]
        pred = tok.decode(new, skip_special_tokens=True)
        preds.append(pred)
        em += float(normalize(pred) == normalize(rec["output"]))
        f1s += f1(pred, rec["output"])
    loss = nll / n
    return {"loss": loss, "perplexity": math.exp(loss), "exact_match": em / len(RECORDS),
            "f1": f1s / len(RECORDS), "n_records": len(RECORDS), "predictions": preds}


def main():
    os.makedirs(os.path.join(OUT, "tokenizer"), exist_ok=True)
    tok = build_tokenizer()
    tok.save(os.path.join(OUT, "tokenizer", "tokenizer.json"))
    with open(os.path.join(OUT, "tokenizer", "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}, f, indent=2)
    with open(os.path.join(OUT, "test.jsonl"), "w") as f:
        for r in RECORDS:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    torch.manual_seed(0)
    base = transformers.AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.float32,
                                                             attn_implementation="eager").eval()
    expected = {"base": evaluate(base, tok)}
    adapted = peft.PeftModel.from_pretrained(base, ADAPTER).eval()
    expected["adapted"] = evaluate(adapted, tok)
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2, ensure_ascii=False)
    print(json.dumps(expected, ensure_ascii=False))


if __name__ == "__main__":
    main()
