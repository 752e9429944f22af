#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/*_fuzz.cpp) into build-fuzz/ with clang,
# ASan and UBSan, and runs each on its seed corpus tests/fuzz/<name>/.
#   scripts/fuzz.sh --quick            each target 20,000 executions or 20 s (the test suite)
#   scripts/fuzz.sh --runs 1000000     each target exactly that many executions
#   scripts/fuzz.sh --time 600         each target for that many seconds
#   scripts/fuzz.sh ... safetensors config   only the named targets
# Prints one line per target (executions, seconds, outcome) and exits non-zero
# if any target crashed, leaked, hit a sanitizer report or timed out on an
# input. Crash inputs land in build-fuzz/artifacts/<name>/; once the bug is
# fixed, copy the input into tests/fuzz/<name>/ as a regression seed.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${LATHE_FUZZ_BUILD_DIR:-build-fuzz}"
mode="" runs="" seconds="" targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) mode=quick; runs=20000; seconds=20 ;;
    --runs) mode=runs; runs="$2"; seconds=0; shift ;;
    --time) mode=time; runs=-1; seconds="$2"; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option '$1'" >&2; exit 2 ;;
    *) targets+=("$1") ;;
  esac
  shift
done
if [ -z "$mode" ]; then
  echo "fuzz.sh: give --quick, --runs N or --time S (see --help)" >&2
  exit 2
fi

if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz/*_fuzz.cpp; do
    [ -e "$f" ] || continue
    n="$(basename "$f" .cpp)"
    targets+=("${n%_fuzz}")
  done
fi
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz.sh: no fuzz targets in fuzz/" >&2
  exit 1
fi

for tool in clang clang++; do
  command -v "$tool" >/dev/null || { echo "fuzz.sh: $tool not found (scripts/setup.sh installs it)" >&2; exit 1; }
done
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DLATHE_FUZZ=ON \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
fi
build_targets=()
for t in "${targets[@]}"; do build_targets+=("${t}_fuzz"); done
mkdir -p "$BUILD_DIR/logs"
if ! ninja -C "$BUILD_DIR" -j "${LATHE_BUILD_JOBS:-$(nproc)}" "${build_targets[@]}" >"$BUILD_DIR/logs/build.log" 2>&1; then
  tail -n 40 "$BUILD_DIR/logs/build.log" >&2
  echo "fuzz.sh: building the fuzz targets failed (full log: $BUILD_DIR/logs/build.log)" >&2
  exit 1
fi

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=0
for t in "${targets[@]}"; do
  bin="$BUILD_DIR/bin/${t}_fuzz"
  seeds="tests/fuzz/$t"
  # Quick runs start from the seeds alone, so their cost does not grow with
  # the corpus that long runs accumulate in $BUILD_DIR/corpus/.
  corpus="$BUILD_DIR/corpus/$t"
  [ "$mode" = quick ] && corpus="$BUILD_DIR/corpus-quick/$t" && rm -rf "$corpus"
  artifacts="$BUILD_DIR/artifacts/$t/"
  log="$BUILD_DIR/logs/$t.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  # A unit taking over a minute is a hang; shorter limits misfire on targets
  # that load large reference files (real tokenizers) on their first input
  # under ASan on a busy machine.
  args=(-runs="$runs" -max_total_time="$seconds" -timeout="${LATHE_FUZZ_TIMEOUT_S:-60}" -rss_limit_mb=2048
        -print_final_stats=1 -artifact_prefix="$artifacts")
  [ -f "fuzz/$t.dict" ] && args+=(-dict="fuzz/$t.dict")
  dirs=("$corpus")
  [ -d "$seeds" ] && dirs+=("$seeds")
  start=$(date +%s)
  rc=0
  "$bin" "${args[@]}" "${dirs[@]}" >"$log" 2>&1 || rc=$?
  elapsed=$(( $(date +%s) - start ))
  execs="$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | tail -1 | awk '{print $2}')"
  rate="$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | tail -1 | awk '{print $2}')"
  if [ "$rc" -eq 0 ]; then
    echo "fuzz $t: ok, ${execs:-?} executions in ${elapsed} s (${rate:-?}/s)"
  else
    failed=1
    artifact="$(grep -o "Test unit written to [^ ]*" "$log" | tail -1 | awk '{print $NF}')"
    echo "fuzz $t: FAILED (exit $rc) after ${execs:-?} executions in ${elapsed} s; log $log${artifact:+; input $artifact}"
    grep -m1 -E "ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|LATHE_CHECK|check failed" "$log" || true
  fi
done
exit $failed
