#!/usr/bin/env python3
"""Writes expected token ids and decodings for lathe's tokenizer tests.

Runs the Hugging Face `tokenizers` library (the reference) on every line of
tests/data/tokenizers/corpus.jsonl (one JSON string per line) with each
tokenizer in ../shared/tokenizers, and writes tests/data/tokenizers/<name>.json:

  {"tokenizers_version": ..., "cases": [
     {"ids": [...],            # encode(text, add_special_tokens=False)
      "ids_special": [...],    # encode(text, add_special_tokens=True)
      "decoded": "...",        # decode(ids_special, skip_special_tokens=False)
      "decoded_skip": "..."}   # decode(ids_special, skip_special_tokens=True)
  ],
  "random_decodes": [         # random id sequences (bytes split mid-character,
     {"ids": [...],            # specials, anything), seeded for repeatability
      "decoded": "...", "decoded_skip": "..."}
  ]}

It also writes two small tokenizers cut down from the real mistral and llama3
files (the first ids of the vocabulary and the merges among them) with added
tokens using every flag (single_word, lstrip, rstrip, normalized, special), as
tests/data/tokenizers/flags_<base>/tokenizer.json, and their expected ids for
tests/data/tokenizers/flags_corpus.jsonl in flags_<base>.json.

Usage: python3 tools/make_tokenizer_fixtures.py [--shared DIR] [--out DIR]
"""
import argparse
import json
import os
import random

import tokenizers

NAMES = ["llama3", "qwen3", "mistral", "gpt4o"]


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", default=os.path.join(root, "..", "shared", "tokenizers"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "data", "tokenizers"))
    args = ap.parse_args()

    with open(os.path.join(args.out, "corpus.jsonl"), encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f if line.strip()]

    for name in NAMES:
        tok = tokenizers.Tokenizer.from_file(os.path.join(args.shared, name, "tokenizer.json"))
        cases = []
        for text in corpus:
            ids = tok.encode(text, add_special_tokens=False).ids
            ids_special = tok.encode(text, add_special_tokens=True).ids
            cases.append({
                "ids": ids,
                "ids_special": ids_special,
                "decoded": tok.decode(ids_special, skip_special_tokens=False),
                "decoded_skip": tok.decode(ids_special, skip_special_tokens=True),
            })
        rng = random.Random(1234)
        n_vocab = tok.get_vocab_size(with_added_tokens=True)
        randoms = []
        for _ in range(40):
            ids = [rng.randrange(n_vocab) if rng.random() < 0.6 else rng.randrange(min(n_vocab, 600))
                   for _ in range(rng.randint(1, 16))]
            randoms.append({
                "ids": ids,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip": tok.decode(ids, skip_special_tokens=True),
            })
        out = {"tokenizers_version": tokenizers.__version__, "cases": cases, "random_decodes": randoms}
        path = os.path.join(args.out, name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        print(f"{path}: {len(cases)} cases")
    write_flag_fixtures(args.shared, args.out)


FLAG_TOKENS = [
    {"content": "<L>", "single_word": False, "lstrip": True, "rstrip": False, "normalized": False, "special": True},
    {"content": "<R>", "single_word": False, "lstrip": False, "rstrip": True, "normalized": False, "special": False},
    {"content": "word", "single_word": True, "lstrip": False, "rstrip": False, "normalized": False, "special": False},
    {"content": "hello world", "single_word": False, "lstrip": False, "rstrip": False, "normalized": True,
     "special": False},
    {"content": "<LR>", "single_word": False, "lstrip": True, "rstrip": True, "normalized": False, "special": True},
    {"content": "café", "single_word": False, "lstrip": False, "rstrip": False, "normalized": True, "special": False},
]


def cut_down(path, n_vocab):
    """The real tokenizer with its vocabulary cut to ids < n_vocab and the
    merges among them, plus FLAG_TOKENS (ids written as the library assigns)."""
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    vocab = {t: i for t, i in j["model"]["vocab"].items() if i < n_vocab}
    merges = []
    for m in j["model"]["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    j["model"]["vocab"] = vocab
    j["model"]["merges"] = merges
    j["added_tokens"] = [t for t in j["added_tokens"] if t["content"] in vocab][:3]
    next_id = len(vocab)
    for t in FLAG_TOKENS:
        j["added_tokens"].append(dict(t, id=vocab.get(t["content"], next_id)))
        next_id += t["content"] not in vocab
    if j.get("post_processor") and j["post_processor"].get("type") == "TemplateProcessing":
        pass  # mistral's <s> is id 1, kept
    return j


def write_flag_fixtures(shared, out):
    with open(os.path.join(out, "flags_corpus.jsonl"), encoding="utf-8") as f:
        texts = [json.loads(line) for line in f if line.strip()]
    for base, n_vocab in (("mistral", 1200), ("llama3", 1500)):
        j = cut_down(os.path.join(shared, base, "tokenizer.json"), n_vocab)
        tdir = os.path.join(out, "flags_" + base)
        os.makedirs(tdir, exist_ok=True)
        tpath = os.path.join(tdir, "tokenizer.json")
        with open(tpath, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
        tok = tokenizers.Tokenizer.from_file(tpath)
        cases = [{"ids": tok.encode(t, add_special_tokens=False).ids,
                  "ids_special": tok.encode(t, add_special_tokens=True).ids} for t in texts]
        with open(os.path.join(out, f"flags_{base}.json"), "w", encoding="utf-8") as f:
            json.dump({"tokenizers_version": tokenizers.__version__, "cases": cases}, f, separators=(",", ":"))
            f.write("\n")
        print(f"{tpath}: {len(cases)} flag cases")


if __name__ == "__main__":
    main()
