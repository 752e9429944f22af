#!/usr/bin/env bash
# `lathe eval` end to end on the tiny llama model with the tokenizer of
# tests/data/eval and the PEFT adapter of tests/data/adapters/llama-lora:
# loss and perplexity against transformers + peft (tests/data/eval/
# expected.json, made by tools/make_eval_fixtures.py), --compare, --json,
# the NeMo directory layout, --report with loss curves, and errors.
set -euo pipefail
LATHE="$1"
DATA="$(cd "$(dirname "$0")/../data" && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

"$LATHE" eval --help | grep -q "collapsed"
# The model directory needs a tokenizer: the fixture model plus the eval tokenizer.
mkdir "$TMP/model"
cp "$DATA/models/llama/config.json" "$DATA/models/llama/model.safetensors" "$TMP/model/"
cp "$DATA/eval/tokenizer/"* "$TMP/model/"

# Loss and perplexity match the reference (relative 1e-4); EM and F1 exactly.
check() {  # check JSON_FILE KEY_PATH(base|adapted|.)
  python3 - "$1" "$2" "$DATA/eval/expected.json" <<'PY'
import json, math, sys
got = json.load(open(sys.argv[1]))
want = json.load(open(sys.argv[3]))[sys.argv[2]]
if "base" in got: got = got["adapted" if sys.argv[2] == "adapted" else "base"]
for k in ("loss", "perplexity"):
    assert abs(got[k] - want[k]) <= 1e-4 * abs(want[k]), (k, got[k], want[k])
for k in ("exact_match", "f1", "n_records"):
    assert got[k] == want[k], (k, got[k], want[k])
PY
}
"$LATHE" eval --model "$TMP/model" --data "$DATA/eval/test.jsonl" --max-new-tokens 8 --json >"$TMP/base.json"
check "$TMP/base.json" base
"$LATHE" eval --model "$TMP/model" --adapter "$DATA/adapters/llama-lora" --data "$DATA/eval/test.jsonl" \
  --max-new-tokens 8 --json >"$TMP/adapted.json"
check "$TMP/adapted.json" adapted
# The checks can fail: the adapted numbers are not the base ones.
if check "$TMP/base.json" adapted 2>/dev/null; then echo "eval e2e: base passed as adapted" >&2; exit 1; fi

# --compare from a NeMo-layout directory, with a report and the run's metrics next to the adapter.
mkdir -p "$TMP/data" "$TMP/run"
cp "$DATA/eval/test.jsonl" "$TMP/data/test.jsonl"
cp "$DATA/eval/test.jsonl" "$TMP/data/training.jsonl"
cp -r "$DATA/adapters/llama-lora" "$TMP/run/adapter"
m='"lr": 0.001, "grad_norm": 1.5, "tokens": 96, "tokens_per_s": 400.0'
printf '%s\n' "{\"step\": 1, \"loss\": 6.5, $m}" "{\"step\": 2, \"loss\": 6.1, $m}" \
  '{"step": 2, "val_loss": 6.3, "perplexity": 544.6}' >"$TMP/run/metrics.jsonl"
"$LATHE" eval --model "$TMP/model" --adapter "$TMP/run/adapter" --data "$TMP/data" --compare \
  --max-new-tokens 8 --report "$TMP/report" >"$TMP/table.txt"
grep -q "^loss .*base\|^metric .*base .*adapted .*delta" "$TMP/table.txt"
grep -q "^perplexity" "$TMP/table.txt"
grep -q "| 4 | 한국의 수도는? *| 서울입니다. |" "$TMP/report/report.md"
grep -q "<svg" "$TMP/report/loss_curves.svg"
"$LATHE" eval --model "$TMP/model" --adapter "$TMP/run/adapter" --data "$TMP/data" --compare \
  --max-new-tokens 8 --json >"$TMP/both.json"
check "$TMP/both.json" base
check "$TMP/both.json" adapted

# Errors name what is wrong.
if "$LATHE" eval --model "$TMP/model" --data "$TMP/nope.jsonl" 2>"$TMP/err"; then exit 1; fi
grep -q "$TMP/nope.jsonl" "$TMP/err"
if "$LATHE" eval --model "$TMP/model" --data "$TMP/data" --compare 2>"$TMP/err"; then exit 1; fi
grep -q -- "--compare needs --adapter" "$TMP/err"
echo '{"input": "x"}' >"$TMP/bad.jsonl"
if "$LATHE" eval --model "$TMP/model" --data "$TMP/bad.jsonl" 2>"$TMP/err"; then exit 1; fi
grep -q "$TMP/bad.jsonl:1:" "$TMP/err"
echo "eval e2e: ok"
