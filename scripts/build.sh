#!/usr/bin/env bash
# Configures and builds lathe into build/ (Release). Extra args go to cmake.
#   scripts/build.sh [-DLATHE_CUDA=OFF ...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${LATHE_BUILD_DIR:-build}"
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
fi
ninja -C "$BUILD_DIR" -j "${LATHE_BUILD_JOBS:-$(nproc)}"
