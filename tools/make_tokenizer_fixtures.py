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


if __name__ == "__main__":
    main()
