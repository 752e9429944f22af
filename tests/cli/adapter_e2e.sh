#!/usr/bin/env bash
# LoRA adapters through the command line: `lathe logits --adapter` on the
# PEFT fixtures of tests/data/adapters matches peft's logits, the base model
# alone does not, `lathe generate --adapter` reproduces the PEFT model's
# greedy tokens (greedy.json), and a bad adapter fails naming its file.
# (`lathe eval --adapter` on the same PEFT adapter: eval_e2e.sh.)
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
# generate needs a tokenizer beside the weights: the eval fixtures' (vocabulary 384, as the model's).
mkdir "$TMP/model"
cp "$DATA/models/llama/config.json" "$DATA/models/llama/model.safetensors" "$DATA/eval/tokenizer/"* "$TMP/model/"
for name in llama-lora llama-rslora; do
  greedy="$DATA/adapters/$name/greedy.json"
  prompt=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompt"])))' "$greedy")
  # EOS ignored as in the fixture: the only stop id is one the fixture never produces.
  got=$("$LATHE" generate --model "$TMP/model" --adapter "$DATA/adapters/$name" --prompt-ids "$prompt" \
    --max-new-tokens 12 --temperature 0 --repetition-penalty 1 --stop-token-ids 383 --json 2>/dev/null)
  python3 - "$greedy" "$got" <<'PY' || { echo "adapter e2e: generate --adapter $name differs from peft's greedy tokens" >&2; exit 1; }
import json, sys
want = json.load(open(sys.argv[1]))["continuation"]
assert 383 not in want
got = json.loads(sys.argv[2])["token_ids"]
assert got == want, (got, want)
PY
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
