#!/usr/bin/env bash
# The S3 column of the checkpoint benchmark: bench_checkpoint saving to moto's
# S3 server on 127.0.0.1 (started here with tests/io/s3_server.py, the same
# server the tests use), so the numbers are lathe's S3 client (SigV4, SHA-256
# of every part, concurrent multipart upload) plus moto, a Python server that
# keeps objects in memory: a floor for what a real store allows, not a
# ceiling. moto holds every object in RAM, so the full-SFT case is scaled down
# by default (FULL_PARAMS, 2e8; 1e9 needs ~40 GB between lathe and moto).
# Usage: bench/checkpoint_bench_s3.sh [build-dir] [extra bench_checkpoint args]
set -euo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${1:-$SRC/build}"
shift || true
BENCH="$BUILD/bin/bench_checkpoint"
[ -x "$BENCH" ] || { echo "no $BENCH: build it (ninja -C $BUILD bench_checkpoint)" >&2; exit 1; }

coproc S3 { exec python3 "$SRC/tests/io/s3_server.py"; }
trap 'exec {S3[1]}>&- 2>/dev/null || true' EXIT
read -r -t 60 info <&"${S3[0]}" || { echo "tests/io/s3_server.py did not start" >&2; exit 1; }
case "$info" in skip:*) echo "$info" >&2; exit 1 ;; esac
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$info" "$1"; }
export AWS_ENDPOINT_URL="$(field endpoint)" AWS_REGION=us-east-1
export AWS_ACCESS_KEY_ID="$(field access_key)" AWS_SECRET_ACCESS_KEY="$(field secret_key)"
export OMP_WAIT_POLICY=passive

echo "S3: moto on $AWS_ENDPOINT_URL, part size ${LATHE_S3_PART_SIZE_MB:-64} MiB, ${LATHE_S3_CONCURRENCY:-4} parts in flight"
"$BENCH" --dir "s3://$(field bucket)/bench" --case adapter "$@"
"$BENCH" --dir "s3://$(field bucket)/bench" --case full --full-params "${FULL_PARAMS:-200000000}" "$@"
