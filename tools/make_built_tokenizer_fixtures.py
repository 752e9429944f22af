#!/usr/bin/env python3
"""Reference ids for the tokenizer lathe builds itself (init-model's default):
runs `lathe init-model --preset tiny`, loads the tokenizer.json it wrote with
the Hugging Face `tokenizers` library, and records the ids for a set of texts
(with and without special tokens) plus the decoded text.

Writes tests/data/engine/built_tokenizer_ids.json. Run from the repository root
after building:
    python3 tools/make_built_tokenizer_fixtures.py build/bin/lathe
"""
import json
import os
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer

TEXTS = [
    "Hello world! It's 2025.",
    "The lathe turns wood.\n\nWhat is the best speed?",
    "  leading spaces and trailing   ",
    "Numbers: 1234567 and 3.14159, dates 2025-06-01.",
    "héllo wörld — 日本語 🙂 naïve café",
    "def add(a, b):\n    return a + b\n",
    "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>",
    "I'd've thought they'll say WE'RE here",
    "",
    "\t\ttabs\r\nand CRLF\r\n",
]


def main():
    lathe = sys.argv[1] if len(sys.argv) > 1 else "build/bin/lathe"
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "tiny")
        subprocess.run([lathe, "init-model", "--preset", "tiny", "--out", out], check=True, stdout=subprocess.DEVNULL)
        tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
        cases = []
        for text in TEXTS:
            for special in (True, False):
                ids = tok.encode(text, add_special_tokens=special).ids
                cases.append({
                    "text": text,
                    "add_special_tokens": special,
                    "ids": ids,
                    "decoded": tok.decode(ids, skip_special_tokens=False),
                })
        data = {"made_by": "tools/make_built_tokenizer_fixtures.py", "vocab_size": tok.get_vocab_size(), "cases": cases}
    path = os.path.join("tests", "data", "engine", "built_tokenizer_ids.json")
    with open(path, "w") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
    print(f"wrote {len(cases)} cases to {path}")


if __name__ == "__main__":
    main()
