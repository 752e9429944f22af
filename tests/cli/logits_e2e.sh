#!/usr/bin/env bash
# `lathe logits` end to end on the tiny fixtures of tests/data/models: the
# logits it writes match transformers' (compared by --reference), and bad
# input fails with a message naming the file.
set -euo pipefail
LATHE="$1"
DATA="$(cd "$(dirname "$0")/../data/models" && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

"$LATHE" logits --help | grep -q -- "--input-ids"
for family in llama mistral qwen2 qwen3; do
  "$LATHE" logits --model "$DATA/$family" --input-ids "$DATA/$family/reference.safetensors" \
    --out "$TMP/$family.safetensors" --reference "$DATA/$family/reference.safetensors" --tolerance 1e-4
  test -s "$TMP/$family.safetensors"
done
# The comparison can fail: another model's logits, or a tolerance below fp32 noise.
if "$LATHE" logits --model "$DATA/llama" --input-ids "$DATA/llama/reference.safetensors" \
  --out "$TMP/x.safetensors" --reference "$DATA/mistral/reference.safetensors" 2>"$TMP/err"; then
  echo "logits e2e: a wrong reference was accepted" >&2; exit 1
fi
if "$LATHE" logits --model "$DATA/llama" --input-ids "$DATA/llama/reference.safetensors" \
  --out "$TMP/x.safetensors" --reference "$DATA/llama/reference.safetensors" --tolerance 1e-12 >/dev/null 2>"$TMP/err"; then
  echo "logits e2e: a 1e-12 tolerance was met, the comparison is not comparing" >&2; exit 1
fi
grep -q "relative error" "$TMP/err"
# A missing model directory is an error naming it.
if "$LATHE" logits --model "$TMP/nope" --input-ids "$DATA/llama/reference.safetensors" \
  --out "$TMP/y.safetensors" 2>"$TMP/err"; then
  echo "logits e2e: a missing model was accepted" >&2; exit 1
fi
grep -q "$TMP/nope" "$TMP/err"
echo "logits e2e: ok"
