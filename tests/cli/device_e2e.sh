#!/usr/bin/env bash
# End-to-end checks for --device on `lathe generate` and `lathe logits`: bad
# names are refused; without a GPU (or a CUDA build) a cuda device is a clear
# error; with one, generation runs there and its logits agree with the CPU's
# within the bf16 tolerance of tests/cuda/causal_lm_gen_test.cpp (3e-2).
set -euo pipefail
LATHE="$1"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
fail() { echo "device e2e: FAIL: $*" >&2; exit 1; }

M="$TMP/tiny"
"$LATHE" init-model --preset tiny --out "$M" --seed 3 >/dev/null
gen() { "$LATHE" generate --model "$M" --prompt-ids 1,2,3,4 --max-new-tokens 8 --temperature 0 --json "$@"; }

for bad in tpu cuda: cuda:x cuda:-1; do
  if gen --device "$bad" >/dev/null 2>"$TMP/err"; then fail "--device $bad was accepted"; fi
  grep -q "is not a device" "$TMP/err" || fail "--device $bad: unclear error: $(cat "$TMP/err")"
done
cpu="$(gen --device cpu 2>/dev/null)" || fail "--device cpu failed"

if gen --device cuda >"$TMP/out" 2>"$TMP/err"; then
  # A GPU is here: the run made 8 tokens, and logits agree with the CPU's.
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert len(r["token_ids"]) == 8, r' "$TMP/out" \
    || fail "--device cuda did not generate 8 tokens: $(cat "$TMP/out")"
  python3 -c '
import json, struct, sys
ids = [1, 2, 3, 4, 5, 6, 7, 8]
h = json.dumps({"input_ids": {"dtype": "I64", "shape": [1, len(ids)], "data_offsets": [0, 8 * len(ids)]}}).encode()
h = h.ljust((len(h) + 7) // 8 * 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<%dq" % len(ids), *ids))' "$TMP/ids.safetensors"
  "$LATHE" logits --model "$M" --input-ids "$TMP/ids.safetensors" --out "$TMP/cpu.safetensors" --device cpu >/dev/null
  "$LATHE" logits --model "$M" --input-ids "$TMP/ids.safetensors" --out "$TMP/gpu.safetensors" --device cuda \
    --reference "$TMP/cpu.safetensors" --tolerance 3e-2 || fail "GPU logits differ from the CPU's"
else
  grep -qi "cuda" "$TMP/err" || fail "--device cuda without a GPU: unclear error: $(cat "$TMP/err")"
  # auto falls back to the CPU and gives the CPU's tokens.
  [ "$(gen 2>/dev/null)" = "$cpu" ] || fail "--device auto without a GPU differs from --device cpu"
fi
echo "device e2e: ok"
