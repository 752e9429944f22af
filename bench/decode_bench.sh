#!/usr/bin/env bash
# CPU decode benchmark: a llama-3.2-1b-shaped random model in bf16 (2.5 GB,
# made once and kept under the build directory), lathe's decode tokens/s at
# batch 1 beside the memory-bandwidth floor measured in the same call, then
# the same decode in PyTorch (transformers) on the CPU when it is installed.
#
#   bench/decode_bench.sh [build-dir]        # env: NEW_TOKENS (64), PROMPT_TOKENS (16)
set -euo pipefail
BUILD="${1:-build}"
NEW_TOKENS="${NEW_TOKENS:-64}"
PROMPT_TOKENS="${PROMPT_TOKENS:-16}"
MODEL="$BUILD/bench-models/llama-3.2-1b-bf16"
if [ ! -f "$MODEL/model.safetensors" ]; then
  echo "making $MODEL (once)..." >&2
  "$BUILD/bin/lathe" init-model --preset llama-3.2-1b --dtype bf16 --seed 0 --out "$MODEL" --force >&2
fi
echo "== lathe (threads: ${LATHE_NUM_THREADS:-${OMP_NUM_THREADS:-all}})"
"$BUILD/bin/bench_decode" --model "$MODEL" --prompt-tokens "$PROMPT_TOKENS" --new-tokens "$NEW_TOKENS"
if python3 -c "import torch, transformers" 2>/dev/null; then
  echo
  echo "== baseline: PyTorch + transformers on the CPU"
  python3 "$(dirname "$0")/decode_torch_baseline.py" --model "$MODEL" --prompt-tokens "$PROMPT_TOKENS" \
    --new-tokens "$NEW_TOKENS"
fi
