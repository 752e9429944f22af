#!/usr/bin/env bash
# The main job on the built-in default: make a tiny model, then generate from it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
LATHE=build/bin/lathe
OUT="${LATHE_DEMO_DIR:-runs/demo}"
mkdir -p "$OUT"
echo "== lathe init-model --preset tiny --out $OUT/model"
$LATHE init-model --preset tiny --out "$OUT/model" --seed 1
echo "== lathe inspect $OUT/model"
$LATHE inspect "$OUT/model"
echo "== lathe generate --model $OUT/model --prompt 'Hello' --max-new-tokens 24"
$LATHE generate --model "$OUT/model" --prompt "Hello" --max-new-tokens 24 --temperature 0
echo
