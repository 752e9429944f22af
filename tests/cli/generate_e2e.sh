#!/usr/bin/env bash
# End-to-end checks for `lathe init-model` and `lathe generate`, run the way a
# user runs them: a tiny random model is written, then generated from.
# When torch + transformers are installed, transformers loads the same model
# and its greedy tokens must equal lathe's.
set -euo pipefail
LATHE="$1"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
fail() { echo "generate e2e: FAIL: $*" >&2; exit 1; }
json_field() { python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)[sys.argv[1]]))" "$1"; }

M="$TMP/tiny"
"$LATHE" init-model --preset tiny --out "$M" --seed 1 >/dev/null
for f in config.json model.safetensors generation_config.json tokenizer.json tokenizer_config.json; do
  [ -f "$M/$f" ] || fail "init-model did not write $f"
done
"$LATHE" init-model --preset tiny --out "$TMP/same" --seed 1 >/dev/null
cmp -s "$M/model.safetensors" "$TMP/same/model.safetensors" || fail "init-model is not deterministic for a seed"
"$LATHE" init-model --preset tiny --out "$TMP/other" --seed 2 >/dev/null
cmp -s "$M/model.safetensors" "$TMP/other/model.safetensors" && fail "seeds 1 and 2 wrote the same weights"
"$LATHE" init-model --preset tiny --out "$TMP/same" --seed 1 >/dev/null || fail "init-model did not rerun over its own output"
cmp -s "$M/model.safetensors" "$TMP/same/model.safetensors" || fail "a rerun changed the weights"
# Weights init-model did not write are kept unless --force.
mkdir -p "$TMP/real"
python3 -c '
import json, struct, sys
h = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode().ljust(64)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<f", 1.0))' "$TMP/real/model.safetensors"
"$LATHE" init-model --preset tiny --out "$TMP/real" 2>/dev/null && fail "init-model overwrote a real model without --force"
"$LATHE" init-model --preset tiny --out "$TMP/real" --force >/dev/null || fail "--force did not overwrite"
"$LATHE" init-model --preset tiny --out "$TMP/bf16" --dtype bf16 >/dev/null
"$LATHE" init-model --config "$M/config.json" --out "$TMP/fromcfg" >/dev/null
cmp -s "$M/config.json" "$TMP/fromcfg/config.json" || fail "--config did not reproduce the config"

gen() { "$LATHE" generate --model "$M" --prompt "The lathe" --max-new-tokens 16 "$@" 2>/dev/null; }
a="$(gen --temperature 0.9 --seed 7 --json)"
b="$(gen --temperature 0.9 --seed 7 --json)"
c="$(gen --temperature 0.9 --seed 8 --json)"
[ "$a" = "$b" ] || fail "same seed, different output: $a vs $b"
[ "$(echo "$a" | json_field token_ids)" != "$(echo "$c" | json_field token_ids)" ] || fail "seeds 7 and 8 gave the same tokens"
[ "$(echo "$a" | json_field finish_reason)" = '"length"' ] || [ "$(echo "$a" | json_field finish_reason)" = '"stop"' ] \
  || fail "bad finish_reason in $a"

# Streamed text equals the JSON text; greedy ignores the seed.
g="$(gen --temperature 0 --json)"
[ "$g" = "$(gen --temperature 0 --seed 99 --json)" ] || fail "greedy depends on the seed"
gen --temperature 0 >"$TMP/streamed.txt"
echo "$g" | python3 -c 'import json,sys; t=json.load(sys.stdin)["text"]; sys.exit(open(sys.argv[1], encoding="utf-8").read() != t + "\n")' \
  "$TMP/streamed.txt" || fail "streamed text differs from the --json text"

# A stop token id ends generation at once: the first greedy token.
first="$(echo "$g" | python3 -c 'import json,sys; print(json.load(sys.stdin)["token_ids"][0])')"
s="$(gen --temperature 0 --json --stop-token-ids "$first")"
[ "$(echo "$s" | json_field token_ids)" = "[$first]" ] || fail "--stop-token-ids $first: $s"
[ "$(echo "$s" | json_field finish_reason)" = '"stop"' ] || fail "--stop-token-ids gave $s"

# Greedy equals the argmax of `lathe logits` over prompt + generated tokens.
g2="$("$LATHE" generate --model "$M" --prompt-ids 512,84,104,101,32 --max-new-tokens 10 --temperature 0 --repetition-penalty 1.0 --stop-token-ids 0 --json 2>/dev/null)"
echo "$g2" | python3 -c '
import json, struct, sys
ids = [512, 84, 104, 101, 32] + json.load(sys.stdin)["token_ids"][:-1]
header = json.dumps({"input_ids": {"dtype": "I64", "shape": [1, len(ids)], "data_offsets": [0, 8 * len(ids)]}}).encode()
header += b" " * (-len(header) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header + struct.pack("<%dq" % len(ids), *ids))
' "$TMP/ids.safetensors"
"$LATHE" logits --model "$M" --input-ids "$TMP/ids.safetensors" --out "$TMP/logits.safetensors" >/dev/null
echo "$g2" | python3 -c '
import array, json, struct, sys
gen = json.load(sys.stdin)["token_ids"]
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
meta = json.loads(raw[8:8 + n])["logits"]
assert meta["dtype"] == "F32", meta
_, seq, vocab = meta["shape"]
b, e = meta["data_offsets"]
x = array.array("f", raw[8 + n + b:8 + n + e])
argmax = [max(range(vocab), key=lambda v: x[r * vocab + v]) for r in range(seq)]
want = argmax[4:]
sys.exit(0 if want == gen else "greedy %s != logits argmax %s" % (gen, want))
' "$TMP/logits.safetensors" || fail "greedy tokens are not the argmax of lathe logits"

# --chat renders the template (the prompt grows by the header tokens).
chat="$("$LATHE" generate --model "$M" --prompt "hi" --chat --system "be brief" --max-new-tokens 2 --temperature 0 --json 2>/dev/null)"
plain="$("$LATHE" generate --model "$M" --prompt "hi" --max-new-tokens 2 --temperature 0 --json 2>/dev/null)"
[ "$(echo "$chat" | json_field prompt_tokens)" -gt "$(echo "$plain" | json_field prompt_tokens)" ] || fail "--chat prompt: $chat"

# Timing goes to stderr.
"$LATHE" generate --model "$M" --prompt "x" --max-new-tokens 4 2>&1 >/dev/null | grep -q "decode" || fail "no timing on stderr"

# Errors: non-zero exit and a message naming the problem.
expect_error() {
  local pattern="$1"; shift
  local out
  if out="$("$LATHE" "$@" 2>&1)"; then fail "succeeded: $*"; fi
  echo "$out" | grep -qi -- "$pattern" || fail "message for '$*' lacks '$pattern': $out"
}
expect_error "not a directory" generate --model "$TMP/missing" --prompt hi
expect_error "prompt" generate --model "$M"
expect_error "temperature" generate --model "$M" --prompt hi --temperature -1
expect_error "top_p" generate --model "$M" --prompt hi --top-p 2
expect_error "token id" generate --model "$M" --prompt-ids 1,x,3
expect_error "vocabulary" generate --model "$M" --prompt-ids 1,999999
expect_error "--no-such-flag" generate --model "$M" --prompt hi --no-such-flag
expect_error "preset" init-model --preset nope --out "$TMP/nope"
expect_error "dtype" init-model --preset tiny --dtype f64 --out "$TMP/nope"
expect_error "preset" init-model --out "$TMP/nope"

# transformers loads the model and decodes greedily (with a repetition penalty) to the same tokens.
if python3 -c "import torch, transformers" 2>/dev/null; then
  want="$("$LATHE" generate --model "$M" --prompt-ids 512,84,104,101 --max-new-tokens 12 --temperature 0 --repetition-penalty 1.3 --stop-token-ids 0 --json 2>/dev/null | json_field token_ids)"
  got="$(python3 - "$M" 2>/dev/null <<'PY'
import json, sys, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
out = m.generate(torch.tensor([[512, 84, 104, 101]]), max_new_tokens=12, do_sample=False, eos_token_id=0,
                 pad_token_id=0, repetition_penalty=1.3)
print(json.dumps(out[0, 4:].tolist()))
PY
)"
  [ "$want" = "$got" ] || fail "greedy tokens differ from transformers: lathe $want, transformers $got"
  # The chat prompt has as many tokens as transformers' apply_chat_template gives.
  hf_chat="$(python3 - "$M" 2>/dev/null <<'PY'
import sys
from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained(sys.argv[1])
msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
ids = t.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
print(len(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
PY
)"
  [ "$hf_chat" = "$(echo "$chat" | json_field prompt_tokens)" ] || fail "chat prompt: transformers $hf_chat tokens, lathe $chat"
fi
echo "generate e2e: ok"
