#!/usr/bin/env bash
# The GPU trainer's memory budget through `lathe finetune --device cuda`:
# - selective recompute (trainer.activations_checkpoint_granularity=
#   selective) with the default budget (the GPU's free memory) keeps q|k|v
#   in every layer of the tiny model; with trainer.gpu_memory_gib below its
#   least plan, the run is refused naming the key and the bytes that plan
#   needs; with exactly those bytes (+ 64), no layer keeps q|k|v and the run
#   still trains to the same losses;
# - a recipe without activations_checkpoint whose activations do not fit
#   trainer.gpu_memory_gib recomputes instead and says so, again to the same
#   losses: with exactly the bytes full recomputation needs, fully; below
#   them, it is refused the same way;
# - a negative budget is refused naming the key.
# "The same losses": kept or recomputed, the values are bitwise the same; the
# band is cuda_resume_e2e.sh's relative 1e-5 for the order of two atomic
# sums. The progress line names what the plan chose ("selective: K of N
# layers keep q|k|v"). The model is the tiny preset regrouped to head_dim
# 64 (cuda_common.sh). Exits 77 (ctest's skip) without a GPU or CUDA build.
# Usage: cuda_selective_e2e.sh path/to/lathe (or LATHE=path/to/lathe).
set -euo pipefail
E2E="cuda selective e2e"
source "$(dirname "$0")/cuda_prelude.sh"  # LATHE, SRC, TMP, fail, skip; skips without a GPU; the model in $M

ARGS=(--model "$M" --data "$SRC/data/sample" --progress lines --device cuda trainer.max_steps=6
      trainer.val_check_interval=0 trainer.log_every_n_steps=1 data.seq_length=128 data.micro_batch_size=4
      data.global_batch_size=8 optim.sched.warmup_steps=2)
SEL=(trainer.activations_checkpoint=true trainer.activations_checkpoint_granularity=selective)
run() {  # run NAME [overrides...]
  local name="$1"
  shift
  "$LATHE" finetune "${ARGS[@]}" --run-dir "$TMP/$name" "$@" >/dev/null 2>"$TMP/$name.log" \
    || { cat "$TMP/$name.log" >&2; fail "run $name"; }
  grep -m1 "device: cuda:0" "$TMP/$name.log" || fail "run $name did not train on cuda:0"
}
losses() { python3 -c 'import json,sys
print(" ".join(repr(r["loss"]) for r in map(json.loads, open(sys.argv[1])) if "val_loss" not in r))' "$1"; }

run all "${SEL[@]}"
grep -q "selective: 4 of 4 layers keep q|k|v" "$TMP/all.log" || fail "default budget: expected all 4 layers to keep q|k|v"
# refused NAME MODE [overrides...]: the run fails naming the budget's key
# and MODE's least plan; prints the trainer.gpu_memory_gib that holds it.
refused() {
  local name="$1" mode="$2"
  shift 2
  if "$LATHE" finetune "${ARGS[@]}" --run-dir "$TMP/$name" "$@" >/dev/null 2>"$TMP/$name.log"; then
    fail "run $name: a budget below its least plan was accepted"
  fi
  grep -q "trainer.gpu_memory_gib" "$TMP/$name.log" || fail "run $name: the refusal does not name the key: $(cat "$TMP/$name.log")"
  grep -q "the arena with $mode" "$TMP/$name.log" || fail "run $name: expected $mode's plan: $(cat "$TMP/$name.log")"
  python3 -c 'import re,sys
m = re.search(r"needs at least (\d+) bytes", open(sys.argv[1]).read())
sys.exit("no byte count in the refusal") if not m else print("%.12f" % ((int(m.group(1)) + 64) / 2**30 + 1.0))' \
    "$TMP/$name.log" || fail "run $name: $(cat "$TMP/$name.log")"
}
gib="$(refused none_low "selective recomputation" "${SEL[@]}" trainer.gpu_memory_gib=0.000001)"
echo "selective's least plan: trainer.gpu_memory_gib=$gib"
run none "${SEL[@]}" trainer.gpu_memory_gib="$gib"
grep -q "selective: 0 of 4 layers keep q|k|v" "$TMP/none.log" || fail "the least budget: expected no layer to keep q|k|v"
a="$(losses "$TMP/all/metrics.jsonl")"
b="$(losses "$TMP/none/metrics.jsonl")"
[ -n "$a" ] && [ "$(wc -w <<<"$a")" -eq 6 ] || fail "expected 6 losses, got '$a'"
same() {  # same LOSSES_A LOSSES_B WHAT
  python3 -c 'import sys
a, b = (list(map(float, s.split())) for s in sys.argv[1:3])
bad = [(x, y) for x, y in zip(a, b) if abs(x - y) > 1e-5 * abs(x)]
sys.exit(f"losses differ: {bad}" if bad or len(a) != len(b) else 0)' "$1" "$2" || fail "$3"
}
same "$a" "$b" "kept vs rerun layers"
echo "losses (both runs): $a"
gib="$(refused fit_low "full recomputation" trainer.gpu_memory_gib=0.000001)"
echo "full recomputation's least plan: trainer.gpu_memory_gib=$gib"
run fit trainer.gpu_memory_gib="$gib"
grep -q "full recomputation instead" "$TMP/fit.log" || fail "no recomputation chosen under full recomputation's least budget: $(grep device "$TMP/fit.log")"
grep -q "selective:" "$TMP/fit.log" && fail "full recomputation reported a selective plan"
same "$a" "$(losses "$TMP/fit/metrics.jsonl")" "kept vs fully recomputed"
run plain
grep -q "instead" "$TMP/plain.log" && fail "the default budget recomputes the tiny model"
same "$a" "$(losses "$TMP/plain/metrics.jsonl")" "kept vs no recompute"
if "$LATHE" finetune "${ARGS[@]}" "${SEL[@]}" --run-dir "$TMP/neg" trainer.gpu_memory_gib=-1 >/dev/null 2>"$TMP/neg.log"; then
  fail "a negative trainer.gpu_memory_gib was accepted"
fi
grep -q "trainer.gpu_memory_gib" "$TMP/neg.log" || fail "the refusal does not name the key: $(cat "$TMP/neg.log")"
echo "cuda selective e2e: ok"
