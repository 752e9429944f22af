#!/usr/bin/env python3
"""Differential check of `lathe tokenize` against the Hugging Face `tokenizers`
library on random text mixing scripts, emoji, digits, whitespace runs,
punctuation and special-token strings. Prints every mismatch (up to a limit)
and exits non-zero if any.

Usage: python3 tools/tokenizer_diff.py LATHE_BIN [--n 2000] [--seed 1] [--names llama3,mistral]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import tokenizers

ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    " \t\n\r\u00a0\u3000\u2028\u0085\u200b\u180e",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "가나다라마바사아자차카타파하한국어문장입니다",
    "你好世界中文字符測試繁體简体",
    "ひらがなカタカナ漢字",
    "éèêëñçüöäßÆØÅœ\u0301\u0308\u030a",
    "😀👍🏽👨‍👩‍👧🇰🇷❤️✌️🏳️‍🌈\u200d\ufe0f",
    "αβγδЖЗИЙКعربيעבריתहिन्दीไทย",
    "▁ĠĊ\ufffd\ue000𝕳𐍈",
]
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<s>", "</s>", "<unk>", "<|endoftext|>", "<|im_start|>",
            "<|im_end|>", "<think>", "'s", "'LL", "'ve"]


def random_text(rng):
    parts = []
    for _ in range(rng.randint(0, 12)):
        r = rng.random()
        if r < 0.1:
            parts.append(rng.choice(SPECIALS))
        elif r < 0.2:
            parts.append(rng.choice([" ", "\n", "\t", "  "]) * rng.randint(1, 9))
        elif r < 0.3:  # any code point but surrogates
            cps = [rng.randint(1, 0x2FFFF) for _ in range(rng.randint(1, 6))]
            parts.append("".join(chr(c) for c in cps if not 0xD800 <= c < 0xE000))
        else:
            alpha = rng.choice(ALPHABETS)
            parts.append("".join(rng.choice(alpha) for _ in range(rng.randint(1, 10))))
    return "".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lathe")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--names", default="llama3,qwen3,mistral,gpt4o")
    ap.add_argument("--shared", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "tokenizers"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    texts = [random_text(rng) for _ in range(args.n)]
    bad = 0
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps(t) + "\n")
        path = f.name
    for name in args.names.split(","):
        tdir = os.path.join(args.shared, name)
        ref = tokenizers.Tokenizer.from_file(os.path.join(tdir, "tokenizer.json"))
        for special in (False, True):
            cmd = [args.lathe, "tokenize", "--tokenizer", tdir, "--jsonl", path]
            if special:
                cmd.append("--add-special-tokens")
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()
            # blank input lines are skipped by lathe; none are blank here (json strings)
            for t, line in zip(texts, out):
                want = ref.encode(t, add_special_tokens=special).ids
                got = json.loads(line)
                if got != want:
                    bad += 1
                    if bad <= 20:
                        print(f"{name} special={special} text={t!r}\n  want {want}\n  got  {got}")
    os.unlink(path)
    print(f"mismatches: {bad}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
