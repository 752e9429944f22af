#!/usr/bin/env bash
# Resuming a GPU fine-tune through `lathe finetune --device cuda`: a run
# stopped at step 8 by trainer.max_steps (the same 12-step schedule) and
# resumed with resume=auto must continue on the GPU from the checkpoint's
# LoRA factors, AdamW moments and step count, and log the same losses as an
# uninterrupted GPU run. The device's arithmetic is deterministic except the
# order of two f32/f64 atomic sums (the loss and the gradient norm), so the
# losses are compared to a relative 1e-5 (two uninterrupted runs are
# compared the same way, to show the band holds run to run); the bf16-vs-f32
# differences between devices are ~1e-3 (cuda_finetune_e2e.sh), and
# continuing without the restored moments or step count changes the
# AdamW update itself.
# Then the same for full-parameter SFT (peft.peft_scheme=none).
# The model is the tiny preset regrouped to head_dim 64, as in
# cuda_finetune_e2e.sh. Exits 77 (ctest's skip) without a GPU or CUDA build.
# Usage: cuda_resume_e2e.sh path/to/lathe (or LATHE=path/to/lathe).
set -euo pipefail
E2E="cuda resume e2e"
source "$(dirname "$0")/cuda_prelude.sh"  # LATHE, SRC, TMP, fail, skip; skips without a GPU; the model in $M

ARGS=(--model "$M" --data "$SRC/data/sample" --progress lines --device cuda
      peft.dim=8 peft.alpha=16 trainer.max_steps=12 trainer.val_check_interval=4
      data.seq_length=128 data.micro_batch_size=5 data.global_batch_size=10 optim.lr=0.003
      optim.sched.warmup_steps=2 optim.sched.max_steps=12 checkpoint.every_n_train_steps=2 checkpoint.save_top_k=2
      checkpoint.async_save=false)
losses() {  # train losses of a run, "step value" per line
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "val_loss" not in r: print(r["step"], repr(r["loss"]))' "$1"
}
compare() {  # compare A B TOL -> prints the largest relative difference; fails above TOL
  python3 - "$1" "$2" "$3" <<'PY'
import sys
a = dict(l.split() for l in open(sys.argv[1])); b = dict(l.split() for l in open(sys.argv[2]))
assert sorted(a, key=int) == sorted(b, key=int), (sorted(a), sorted(b))
worst = max(abs(float(a[s]) - float(b[s])) / abs(float(a[s])) for s in a)
print(f"largest relative loss difference {worst:.3e} (limit {sys.argv[3]})")
sys.exit(0 if worst <= float(sys.argv[3]) else 1)
PY
}

"$LATHE" finetune "${ARGS[@]}" --run-dir "$TMP/a" >/dev/null 2>"$TMP/a.log" || { cat "$TMP/a.log" >&2; fail "run a"; }
grep -q "device: cuda:0" "$TMP/a.log" || fail "run a did not train on cuda:0: $(grep device "$TMP/a.log")"
losses "$TMP/a/metrics.jsonl" >"$TMP/a.losses"

"$LATHE" finetune "${ARGS[@]}" --run-dir "$TMP/c" trainer.max_steps=8 >/dev/null 2>"$TMP/c1.log" \
  || { cat "$TMP/c1.log" >&2; fail "run c, first half"; }
"$LATHE" finetune "${ARGS[@]}" --run-dir "$TMP/c" resume=auto >/dev/null 2>"$TMP/c2.log" \
  || { cat "$TMP/c2.log" >&2; fail "run c, second half"; }
grep -q "at step 8" "$TMP/c2.log" || fail "run c did not resume at step 8: $(cat "$TMP/c2.log")"
grep -q "device: cuda:0" "$TMP/c2.log" || fail "the resumed run did not train on cuda:0: $(grep device "$TMP/c2.log")"
losses "$TMP/c/metrics.jsonl" >"$TMP/c.losses"
compare "$TMP/a.losses" "$TMP/c.losses" 1e-5 || fail "stopped and resumed GPU run differs from the uninterrupted one"

# For the record: how far two uninterrupted GPU runs are from each other.
"$LATHE" finetune "${ARGS[@]}" --run-dir "$TMP/a2" >/dev/null 2>"$TMP/a2.log" || { cat "$TMP/a2.log" >&2; fail "run a2"; }
losses "$TMP/a2/metrics.jsonl" >"$TMP/a2.losses"
echo -n "run to run: "; compare "$TMP/a.losses" "$TMP/a2.losses" 1e-5 || fail "two uninterrupted GPU runs differ by more than 1e-5"

# Full-parameter SFT the same way: the checkpoint holds every weight's f32
# master and AdamW moments (the host table's), and the resumed run repeats
# the uninterrupted one (its gradient sums run in a fixed order too).
FULL=(peft.peft_scheme=none optim.lr=0.001)
"$LATHE" finetune "${ARGS[@]}" "${FULL[@]}" --run-dir "$TMP/f" >/dev/null 2>"$TMP/f.log" \
  || { cat "$TMP/f.log" >&2; fail "full SFT run f"; }
grep -q "device: cuda:0" "$TMP/f.log" || fail "full SFT run f did not train on cuda:0: $(grep device "$TMP/f.log")"
losses "$TMP/f/metrics.jsonl" >"$TMP/f.losses"
"$LATHE" finetune "${ARGS[@]}" "${FULL[@]}" --run-dir "$TMP/g" trainer.max_steps=8 >/dev/null 2>"$TMP/g1.log" \
  || { cat "$TMP/g1.log" >&2; fail "full SFT run g, first half"; }
"$LATHE" finetune "${ARGS[@]}" "${FULL[@]}" --run-dir "$TMP/g" resume=auto >/dev/null 2>"$TMP/g2.log" \
  || { cat "$TMP/g2.log" >&2; fail "full SFT run g, second half"; }
grep -q "at step 8" "$TMP/g2.log" || fail "full SFT run g did not resume at step 8: $(cat "$TMP/g2.log")"
grep -q "device: cuda:0" "$TMP/g2.log" || fail "the resumed full SFT run did not train on cuda:0"
losses "$TMP/g/metrics.jsonl" >"$TMP/g.losses"
echo -n "full SFT: "; compare "$TMP/f.losses" "$TMP/g.losses" 1e-5 \
  || fail "stopped and resumed full-SFT GPU run differs from the uninterrupted one"
echo "cuda resume e2e: ok"
