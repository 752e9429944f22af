#!/usr/bin/env bash
# Installs what the tests need, builds, and runs the whole test suite:
# unit and fidelity tests (ctest), CLI end-to-end scripts, and short bounded
# fuzz runs. Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
(cd "${LATHE_BUILD_DIR:-build}" && ctest --output-on-failure -j "$(nproc)")
if [ -x scripts/fuzz.sh ]; then
  scripts/fuzz.sh --quick
fi
