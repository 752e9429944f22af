#!/usr/bin/env python3
"""Baseline for bench_chat_template: transformers' apply_chat_template(tokenize=False)
with the same template and conversations. Prints "n_messages microseconds_per_render"
lines. Usage: chat_template.py TOKENIZER_DIR N1 [N2 ...]"""
import sys
import time

from transformers import AutoTokenizer


def conversation(n):
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(n - 1):
        role = "user" if i % 2 == 0 else "assistant"
        msgs.append({"role": role, "content": f"Message {i}: 오늘 날씨가 좋네요. The quick brown fox jumps over the lazy dog."})
    return msgs


def main():
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    for n in map(int, sys.argv[2:]):
        msgs = conversation(n)
        tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)  # compile once
        reps = max(5, 2000 // n)
        t0 = time.perf_counter()
        for _ in range(reps):
            tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        print(n, (time.perf_counter() - t0) / reps * 1e6, flush=True)


if __name__ == "__main__":
    main()
