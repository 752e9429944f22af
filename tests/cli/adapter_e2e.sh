#!/usr/bin/env bash
# LoRA adapters through the command line: `lathe logits --adapter` on the
# PEFT fixtures of tests/data/adapters matches peft's logits, the base model
# alone does not, and a bad adapter fails naming its file.
set -euo pipefail
LATHE="$1"
DATA="$(cd "$(dirname "$0")/../data" && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

for name in llama-lora llama-rslora; do
  ref="$DATA/adapters/$name/reference.safetensors"
  "$LATHE" logits --model "$DATA/models/llama" --adapter "$DATA/adapters/$name" --input-ids "$ref" \
    --out "$TMP/$name.safetensors" --reference "$ref" --tolerance 1e-4 >/dev/null
  if "$LATHE" logits --model "$DATA/models/llama" --input-ids "$ref" --out "$TMP/base.safetensors" \
    --reference "$ref" --tolerance 1e-4 >/dev/null 2>&1; then
    echo "adapter e2e: the base model matched $name's logits; the adapter is not exercised" >&2; exit 1
  fi
done
mkdir "$TMP/dora"
cp "$DATA/adapters/llama-lora/adapter_model.safetensors" "$TMP/dora/"
sed 's/"use_dora": false/"use_dora": true/' "$DATA/adapters/llama-lora/adapter_config.json" >"$TMP/dora/adapter_config.json"
if "$LATHE" logits --model "$DATA/models/llama" --adapter "$TMP/dora" \
  --input-ids "$DATA/adapters/llama-lora/reference.safetensors" --out "$TMP/x.safetensors" 2>"$TMP/err"; then
  echo "adapter e2e: a DoRA adapter was accepted" >&2; exit 1
fi
grep -q "$TMP/dora/adapter_config.json: field \"use_dora\"" "$TMP/err"
echo "adapter e2e: ok"
