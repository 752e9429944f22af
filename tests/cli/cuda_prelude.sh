# The start the GPU end-to-end scripts share (sourced after `set -euo
# pipefail` and E2E="<the script's name in its messages>"): lathe's path from
# $1 or LATHE, SRC (the checkout), a TMP removed on exit, fail (exit 1) and
# skip (exit 77: ctest's skip), OMP_WAIT_POLICY passive, then
# cuda_common.sh (skips without a GPU; the head_dim-64 model in $M).
LATHE="${1:-${LATHE:-}}"
[ -n "$LATHE" ] && [ -x "$LATHE" ] || { echo "usage: $0 path/to/lathe (or set LATHE)" >&2; exit 2; }
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
fail() { echo "$E2E: FAIL: $*" >&2; exit 1; }
skip() { echo "$E2E: SKIP: $*"; exit 77; }
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
source "$SRC/tests/cli/cuda_common.sh"
