#!/usr/bin/env bash
# LoRA dropout on the GPU through `lathe finetune --device cuda
# peft.dropout=0.1`: a run stopped at step 8 and resumed with resume=auto
# must draw the same masks as an uninterrupted run (the checkpoint's
# dropout_passes carries the mask stream), so its losses match the
# uninterrupted run's to a relative 1e-5 (cuda_resume_e2e.sh's band: the
# device is deterministic but for the order of two atomic sums) and its
# last checkpoint saves the same dropout_passes (as does the CPU trainer's run
# of the recipe: 24 training passes and 3 validations). A run without dropout must
# differ from the dropout run by more than 10x that band (the masks are
# drawn at all), and a resume whose masks restarted from pass 0 would not
# match. The model is the tiny preset regrouped to head_dim 64
# (cuda_common.sh). Exits 77 (ctest's skip) without a GPU or CUDA build.
# Usage: cuda_dropout_e2e.sh path/to/lathe (or LATHE=path/to/lathe).
set -euo pipefail
E2E="cuda dropout e2e"
source "$(dirname "$0")/cuda_prelude.sh"  # LATHE, SRC, TMP, fail, skip; skips without a GPU; the model in $M

ARGS=(--model "$M" --data "$SRC/data/sample" --progress lines peft.dim=8 peft.alpha=16
      trainer.max_steps=12 trainer.val_check_interval=4 data.seq_length=128 data.micro_batch_size=5
      data.global_batch_size=10 optim.lr=0.003 optim.sched.warmup_steps=2 optim.sched.max_steps=12
      checkpoint.every_n_train_steps=2 checkpoint.save_top_k=2 checkpoint.async_save=false)
run() {  # run NAME [overrides...]: fails the script when lathe does
  local name="$1"
  shift
  "$LATHE" finetune "${ARGS[@]}" --device cuda --run-dir "$TMP/${name%%.*}" "$@" >/dev/null 2>"$TMP/$name.log" \
    || { cat "$TMP/$name.log" >&2; fail "run $name"; }
  grep -q "device: cuda:0" "$TMP/$name.log" || fail "run $name did not train on cuda:0: $(grep device "$TMP/$name.log")"
}
losses() {  # train losses of a run, "step value" per line
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "val_loss" not in r: print(r["step"], repr(r["loss"]))' "$TMP/$1/metrics.jsonl" >"$TMP/$1.losses"
}
largest_difference() {  # largest_difference A B -> the largest relative loss difference
  python3 - "$TMP/$1.losses" "$TMP/$2.losses" <<'PY'
import sys
a = dict(l.split() for l in open(sys.argv[1])); b = dict(l.split() for l in open(sys.argv[2]))
assert sorted(a, key=int) == sorted(b, key=int), (sorted(a), sorted(b))
print(max(abs(float(a[s]) - float(b[s])) / abs(float(a[s])) for s in a))
PY
}
passes() {  # the dropout_passes of a run's step-12 checkpoint
  python3 -c 'import glob,json,sys
(p,) = glob.glob(sys.argv[1] + "/checkpoints/step=000012*/trainer_state.json")
print(json.load(open(p))["rng"]["dropout_passes"])' "$TMP/$1"
}

run a peft.dropout=0.1
losses a
run c.1 peft.dropout=0.1 trainer.max_steps=8
run c.2 peft.dropout=0.1 resume=auto
grep -q "at step 8" "$TMP/c.2.log" || fail "run c did not resume at step 8: $(cat "$TMP/c.2.log")"
losses c
d=$(largest_difference a c)
echo "dropout 0.1, stopped at step 8 and resumed vs uninterrupted: largest relative loss difference $d (limit 1e-5)"
python3 -c "import sys; sys.exit(0 if float('$d') <= 1e-5 else 1)" \
  || fail "the resumed dropout run differs from the uninterrupted one"
[ "$(passes a)" = "$(passes c)" ] || fail "dropout_passes: uninterrupted $(passes a), resumed $(passes c)"
echo "dropout_passes at step 12: $(passes a) in both"
# The CPU trainer on the same recipe counts the same passes (training and validation).
"$LATHE" finetune "${ARGS[@]}" --run-dir "$TMP/cpu" --device cpu peft.dropout=0.1 >/dev/null 2>"$TMP/cpu.log" \
  || { cat "$TMP/cpu.log" >&2; fail "run cpu"; }
[ "$(passes cpu)" = "$(passes a)" ] || fail "dropout_passes: cpu $(passes cpu), cuda $(passes a)"

run z peft.dropout=0
losses z
d=$(largest_difference a z)
echo "dropout 0.1 vs 0: largest relative loss difference $d (must exceed 1e-4)"
python3 -c "import sys; sys.exit(0 if float('$d') > 1e-4 else 1)" || fail "dropout 0.1 trains as dropout 0 does"
echo "cuda dropout e2e: ok"
