#!/usr/bin/env bash
# `lathe eval --device`, with or without a GPU: bad names are refused as
# generate refuses them; without a GPU (or a CUDA build) a cuda device is a
# clear error naming what is missing and auto runs on the CPU with the CPU's
# numbers; with one, eval runs on cuda:0 (base and adapted, --compare, a
# report naming the device) and a device index past the last is refused.
# The numbers on the GPU against the CPU's: tests/cuda_train/
# evaluate_cuda_test.cpp and cuda_finetune_e2e.sh. Every run says on stderr
# which device ran.
# Usage: cuda_eval_e2e.sh path/to/lathe (or LATHE=path/to/lathe).
set -euo pipefail
LATHE="${1:-${LATHE:-}}"
[ -n "$LATHE" ] && [ -x "$LATHE" ] || { echo "usage: $0 path/to/lathe (or set LATHE)" >&2; exit 2; }
DATA="$(cd "$(dirname "$0")/../data" && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
fail() { echo "cuda eval e2e: FAIL: $*" >&2; exit 1; }

# The eval fixture: the tiny llama model with the eval tokenizer, and its PEFT adapter.
mkdir "$TMP/model"
cp "$DATA/models/llama/config.json" "$DATA/models/llama/model.safetensors" "$TMP/model/"
cp "$DATA/eval/tokenizer/"* "$TMP/model/"
ev() { "$LATHE" eval --model "$TMP/model" --adapter "$DATA/adapters/llama-lora" --data "$DATA/eval/test.jsonl" \
  --max-new-tokens 8 --json "$@"; }

"$LATHE" eval --help | grep -q -- "--device" || fail "eval --help does not list --device"
for bad in tpu cuda: cuda:x cuda:-1 gpu; do
  if ev --device "$bad" >/dev/null 2>"$TMP/err"; then fail "--device $bad was accepted"; fi
  grep -q "is not a device" "$TMP/err" || fail "--device $bad: unclear error: $(cat "$TMP/err")"
done
ev --device cpu >"$TMP/cpu.json" 2>"$TMP/err" || fail "--device cpu: $(cat "$TMP/err")"
grep -q "device cpu$" "$TMP/err" || fail "--device cpu does not say where it ran: $(cat "$TMP/err")"

if ev --device cuda >"$TMP/gpu.json" 2>"$TMP/err"; then
  grep -q "device cuda:0$" "$TMP/err" || fail "--device cuda does not say it ran on cuda:0: $(cat "$TMP/err")"
  python3 - "$TMP/cpu.json" "$TMP/gpu.json" <<'PY' || fail "the GPU's eval is incomplete"
import json, math, sys
cpu, gpu = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert gpu["n_records"] == cpu["n_records"], (gpu, cpu)
assert math.isfinite(gpu["loss"]) and gpu["exact_match"] is not None and gpu["f1"] is not None, gpu
print(f"cpu loss {cpu['loss']:.5f}, cuda loss {gpu['loss']:.5f}")
PY
  "$LATHE" eval --model "$TMP/model" --adapter "$DATA/adapters/llama-lora" --data "$DATA/eval/test.jsonl" \
    --max-new-tokens 8 --compare --report "$TMP/report" --device cuda >"$TMP/table.txt" 2>"$TMP/err" \
    || fail "--compare --device cuda: $(cat "$TMP/err")"
  grep -q "^device: cuda:0$" "$TMP/table.txt" || fail "the table does not name the device: $(cat "$TMP/table.txt")"
  grep -q "^Device: cuda:0" "$TMP/report/report.md" || fail "the report does not name the device"
  n=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)
  if [ "$n" -gt 0 ]; then
    if ev --device "cuda:$n" >/dev/null 2>"$TMP/err"; then fail "--device cuda:$n was accepted with $n GPUs"; fi
    grep -q "there are only $n CUDA devices" "$TMP/err" || fail "--device cuda:$n: unclear error: $(cat "$TMP/err")"
  fi
else
  grep -q "no CUDA backend\|no CUDA device is visible" "$TMP/err" \
    || fail "--device cuda without a GPU: unclear error: $(cat "$TMP/err")"
  grep -q -- "--device cpu" "$TMP/err" || fail "--device cuda without a GPU does not name the fix: $(cat "$TMP/err")"
  # auto falls back to the CPU, says so, and gives the CPU's numbers.
  ev >"$TMP/auto.json" 2>"$TMP/err" || fail "--device auto without a GPU: $(cat "$TMP/err")"
  grep -q "device cpu$" "$TMP/err" || fail "--device auto does not say it ran on the CPU: $(cat "$TMP/err")"
  cmp -s "$TMP/auto.json" "$TMP/cpu.json" || fail "--device auto without a GPU differs from --device cpu"
  if ev --device cuda:1 >/dev/null 2>"$TMP/err"; then fail "--device cuda:1 was accepted without a GPU"; fi
  "$LATHE" eval --model "$TMP/model" --data "$DATA/eval/test.jsonl" --max-new-tokens 0 --report "$TMP/report" \
    >"$TMP/table.txt" 2>/dev/null || fail "eval with a report failed"
  grep -q "^device: cpu$" "$TMP/table.txt" || fail "the table does not name the device: $(cat "$TMP/table.txt")"
  grep -q "^Device: cpu" "$TMP/report/report.md" || fail "the report does not name the device"
fi
echo "cuda eval e2e: ok"
