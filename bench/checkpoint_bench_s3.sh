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

# The baseline: AWS's own SDK (boto3, the same part size and concurrency)
# uploading the adapter's byte count to the same server, like dd for a disk.
python3 - "$AWS_ENDPOINT_URL" "$(field bucket)" "${BASELINE_BYTES:-346000000}" <<'PY'
import sys, time, boto3
from boto3.s3.transfer import TransferConfig
endpoint, bucket, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
import os, io
part = int(os.environ.get("LATHE_S3_PART_SIZE_MB", "64")) << 20
cfg = TransferConfig(multipart_threshold=part, multipart_chunksize=part,
                     max_concurrency=int(os.environ.get("LATHE_S3_CONCURRENCY", "4")))
data = os.urandom(n)
rates = []
for i in range(3):
    t0 = time.perf_counter()
    s3.upload_fileobj(io.BytesIO(data), bucket, f"baseline/{i}", Config=cfg)
    rates.append(n / 1e6 / (time.perf_counter() - t0))
    s3.delete_object(Bucket=bucket, Key=f"baseline/{i}")
rates.sort()
print(f"| boto3 baseline | {n / 1e6:.0f} MB | upload_fileobj, same part size and concurrency | {rates[1]:.0f} MB/s (median of 3) |")
PY
