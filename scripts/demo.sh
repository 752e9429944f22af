#!/usr/bin/env bash
# The main job on the built-in default, all on the CPU: make the tiny model,
# fine-tune it with LoRA on the bundled sample data (data/sample, a bank's
# Q&A in English and Korean) and watch the loss fall, then generate answers
# with the trained adapter.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
LATHE=build/bin/lathe
OUT="${LATHE_DEMO_DIR:-runs/demo}"
mkdir -p "$OUT"
echo "== lathe init-model --preset tiny --out $OUT/model"
$LATHE init-model --preset tiny --out "$OUT/model" --seed 1
echo "== lathe finetune --model $OUT/model --data data/sample --recipe recipes/tiny_lora.yaml --run-dir $OUT/run"
rm -rf "$OUT/run"
$LATHE finetune --model "$OUT/model" --data data/sample --recipe recipes/tiny_lora.yaml --run-dir "$OUT/run"
# The prompt is the bare question: the space the recipe's template
# "{input} {output}" puts before the answer is trained as part of the answer.
for q in "What is the daily ATM withdrawal limit?" "지점 영업시간은 어떻게 되나요?"; do
  echo "== lathe generate --model $OUT/model --adapter $OUT/run/adapter --prompt '$q'"
  $LATHE generate --model "$OUT/model" --adapter "$OUT/run/adapter" --prompt "$q" --temperature 0 --max-new-tokens 160
  echo
done
