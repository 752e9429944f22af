#!/usr/bin/env python3
"""Reference training examples for lathe's fine-tuning data pipeline.

  tools/make_sft_fixtures.py

For the real tokenizers in ../shared/tokenizers (llama3, qwen3, mistral) and a
set of records ({input, output} lines from data/sample, and chat
conversations), writes tests/data/train/sft_<name>.json: each record's JSON
line and the input_ids / loss_mask lathe must produce for it.

The ids come from Hugging Face `tokenizers` (encode) and the chat text from
transformers' apply_chat_template. The masks are computed here from the
rules of src/train/example.h:
  {input, output}: the targets are the tokens after the longest common prefix
    of the ids of the prompt with its trailing whitespace trimmed and the
    whole text's ids, and the appended EOS; so the template's separator space
    is a target. The script cross-checks this against the tokenizer's
    character offsets (a token carrying a character past the trimmed prompt
    is a target) and prints where the two differ.
  {messages}, by character offsets (a different route from lathe's, which
    compares tokenizations of prefixes): each assistant turn spans from the
    end of the conversation before it rendered with add_generation_prompt=True to where the conversation
    rendered through it stops agreeing with the whole one (or, when that
    rendering differs from the start of the turn, to its content's end plus
    the agreeing tail); a token is a target when it starts inside the span,
    up to and including the first special token.
Token 0 is never a target.
"""
import json
import os

from tokenizers import Tokenizer
from transformers import AutoTokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOKENIZERS = os.path.join(ROOT, "..", "shared", "tokenizers")
OUT = os.path.join(ROOT, "tests", "data", "train")
TEMPLATE = "{input} {output}"

CHATS = [
    [{"role": "user", "content": "What are the branch opening hours?"},
     {"role": "assistant", "content": "Weekdays 9:00 to 16:00; closed on weekends."}],
    [{"role": "system", "content": "You answer questions about Namsan Savings Bank."},
     {"role": "user", "content": "ATM 하루 출금 한도는 얼마인가요?"},
     {"role": "assistant", "content": "카드 한 장당 하루 100만 원입니다."}],
    [{"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "예금은 보호되나요?"},
     {"role": "assistant", "content": "네, 1인당 5천만 원까지 보호됩니다."}],
]

EXTRA_PROMPTS = [
    {"input": "Two lines?", "output": "\nYes:\nlike this."},
    {"input": "How much?", "output": "100 won"},
    {"input": "Padded input  ", "output": "  indented"},
    {"input": "", "output": "empty input"},
    {"input": "Nothing to say", "output": ""},
]


def prompt_example(tok, eos_id, record):
    prompt = TEMPLATE.split("{output}")[0].replace("{input}", record["input"])
    full = prompt + record["output"]
    enc = tok.encode(full, add_special_tokens=True)
    ids = list(enc.ids)
    # lathe's rule: targets follow the longest common prefix of the prompt's
    # and the whole text's ids.
    # The prompt is trimmed of trailing whitespace: the separator is trained.
    trimmed = prompt.rstrip(" \t\r\n\f\v")
    boundary = common_prefix(tok.encode(trimmed, add_special_tokens=True).ids, ids)
    mask = [1 if k >= boundary else 0 for k in range(len(ids))]
    # Cross-check: a token carrying a character past the trimmed prompt
    # (offsets) is a target.
    by_offsets = [1 if end > len(trimmed) else 0 for (_, end) in enc.offsets]
    if by_offsets[1:] != mask[1:]:
        print(f"  note: offsets mark {by_offsets}, prefix rule {mask} for {record!r}: "
              f"{enc.tokens}")
    if not ids or ids[-1] != eos_id:
        ids.append(eos_id)
        mask.append(1)
    else:
        mask[-1] = 1
    mask[0] = 0
    return ids, mask


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def turn_end(msg, start, upto, full):
    agree = common_prefix(upto, full)
    if agree == len(upto) or agree > start:
        return agree
    content = msg.get("content")
    if not isinstance(content, str):
        return None
    for needle in (content, content.strip()):
        if not needle:
            continue
        pos = full.find(needle, start)
        in_upto = upto.rfind(needle)
        if pos < 0 or in_upto < 0:
            continue
        end = pos + len(needle)
        return end + common_prefix(upto[in_upto + len(needle):], full[end:])
    return None


def chat_example(tok, hf, special_ids, messages):
    def render(msgs, gen):
        return hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    full = render(messages, False)
    enc = tok.encode(full, add_special_tokens=False)
    ids = list(enc.ids)
    mask = [0] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(messages[:i], True)
        assert full.startswith(before), "template is not prefix-stable before the turn"
        end = turn_end(m, len(before), render(messages[: i + 1], False), full)
        end = len(full) if end is None else end
        for k, (s, _) in enumerate(enc.offsets):
            if len(before) <= s < end:
                mask[k] = 1
                if ids[k] in special_ids:
                    break
    mask[0] = 0
    return ids, mask


def make(name):
    d = os.path.join(TOKENIZERS, name)
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(d)
    config = json.load(open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8"))
    eos_id = tok.token_to_id(config["eos_token"])
    special_ids = {i for i, t in hf.added_tokens_decoder.items() if t.special}

    with open(os.path.join(ROOT, "data", "sample", "training.jsonl"), encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f][:8]
    lines += [json.dumps(r, ensure_ascii=False) for r in EXTRA_PROMPTS]
    records = []
    for line in lines:
        ids, mask = prompt_example(tok, eos_id, json.loads(line))
        records.append({"line": line, "input_ids": ids, "loss_mask": mask})
    if config.get("chat_template"):
        for messages in CHATS:
            ids, mask = chat_example(tok, hf, special_ids, messages)
            records.append({"line": json.dumps({"messages": messages}, ensure_ascii=False),
                            "input_ids": ids, "loss_mask": mask})
    out = {"tokenizer": name, "prompt_template": TEMPLATE, "records": records}
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"sft_{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
        f.write("\n")
    print(f"{path}: {len(records)} records")


if __name__ == "__main__":
    for name in ("llama3", "qwen3", "mistral"):
        make(name)
