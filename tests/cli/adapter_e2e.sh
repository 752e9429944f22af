#!/usr/bin/env bash
# LoRA adapters through the command line: `lathe logits --adapter` on the
# PEFT fixtures of tests/data/adapters matches peft's logits, the base model
# alone does not, `lathe generate --adapter` reproduces the PEFT model's
# greedy tokens (greedy.json), and a bad adapter fails naming its file.
# `lathe finetune --adapter` starts training from it. (`lathe eval --adapter`
# on the same PEFT adapter: eval_e2e.sh.)
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
# finetune --adapter starts from the PEFT adapter: one step at a learning rate
# too small to move any weight writes back the adapter's own tensors, and its
# r / alpha / rsLoRA replace the recipe's (dim 32 by default).
"$LATHE" finetune --model "$TMP/model" --adapter "$DATA/adapters/llama-rslora" --data "$DATA/eval/test.jsonl" \
  --run-dir "$TMP/ft" --progress lines trainer.max_steps=1 optim.lr=1e-30 optim.sched.warmup_steps=0 \
  data.global_batch_size=1 data.micro_batch_size=1 >/dev/null 2>"$TMP/ft.log" ||
  { cat "$TMP/ft.log" >&2; echo "adapter e2e: finetune --adapter failed" >&2; exit 1; }
python3 - "$DATA/adapters/llama-rslora" "$TMP/ft/adapter" <<'PY' || { echo "adapter e2e: finetune --adapter did not start from the adapter" >&2; exit 1; }
import json, sys
from safetensors.numpy import load_file
src, out = sys.argv[1], sys.argv[2]
a, b = load_file(src + "/adapter_model.safetensors"), load_file(out + "/adapter_model.safetensors")
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
for k in a:
    assert (a[k].astype("float32") == b[k]).all(), k
ca, cb = json.load(open(src + "/adapter_config.json")), json.load(open(out + "/adapter_config.json"))
assert (cb["r"], float(cb["lora_alpha"]), cb["use_rslora"]) == (ca["r"], float(ca["lora_alpha"]), ca["use_rslora"]), cb
PY
if "$LATHE" finetune --model "$TMP/model" --adapter "$TMP/nowhere" --data "$DATA/eval/test.jsonl" \
  --run-dir "$TMP/ft2" trainer.max_steps=1 optim.sched.warmup_steps=0 data.global_batch_size=1 data.micro_batch_size=1 >/dev/null 2>"$TMP/err"; then
  echo "adapter e2e: finetune accepted a missing adapter" >&2; exit 1
fi
grep -q "$TMP/nowhere" "$TMP/err"
mkdir "$TMP/dora"
cp "$DATA/adapters/llama-lora/adapter_model.safetensors" "$TMP/dora/"
sed 's/"use_dora": false/"use_dora": true/' "$DATA/adapters/llama-lora/adapter_config.json" >"$TMP/dora/adapter_config.json"
if "$LATHE" logits --model "$DATA/models/llama" --adapter "$TMP/dora" \
  --input-ids "$DATA/adapters/llama-lora/reference.safetensors" --out "$TMP/x.safetensors" 2>"$TMP/err"; then
  echo "adapter e2e: a DoRA adapter was accepted" >&2; exit 1
fi
grep -q "$TMP/dora/adapter_config.json: field \"use_dora\"" "$TMP/err"
echo "adapter e2e: ok"
