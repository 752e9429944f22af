#!/usr/bin/env bash
# End to end for checkpoints and resume through `lathe finetune`:
#   1. an uninterrupted run (LoRA with dropout, so the dropout stream matters);
#   2. the same run killed with SIGKILL while a checkpoint is half written
#      (LATHE_CHECKPOINT_WRITE_DELAY_MS slows the writer so the kill lands
#      mid-save), then started again with resume=auto: it must remove the
#      partial checkpoint, continue from the previous committed one, and its
#      metrics.jsonl must hold exactly the uninterrupted run's losses;
#   3. a run stopped at step k = 8 (a validation step, as in the full run) by trainer.max_steps (same schedule length)
#      and resumed to the end gives the same losses too;
#   4. `last` names a committed checkpoint, top-k pruning left at most k + 1;
#   5. a flipped byte in the newest checkpoint makes resume fail naming the file.
set -euo pipefail
LATHE="$1"
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
fail() { echo "checkpoint e2e: FAIL: $*" >&2; exit 1; }
export OMP_WAIT_POLICY=passive
export LATHE_NUM_THREADS=2

source "$SRC/tests/cli/checkpoint_common.sh"

# ---- 1. uninterrupted -----------------------------------------------------------
"$LATHE" finetune "${ARGS[@]}" --run-dir "$TMP/a" >/dev/null 2>"$TMP/a.log" || { cat "$TMP/a.log" >&2; fail "run a"; }
losses "$TMP/a/metrics.jsonl" >"$TMP/a.losses"
[ "$(grep -c '^train' "$TMP/a.losses")" = 12 ] || fail "run a has not 12 train records"

# ---- 2. SIGKILL mid-save, resume ---------------------------------------------------
LATHE_CHECKPOINT_WRITE_DELAY_MS=150 "$LATHE" finetune "${ARGS[@]}" --run-dir "$TMP/b" >/dev/null 2>"$TMP/b1.log" &
pid=$!
partial=""
for _ in $(seq 1 600); do
  ck="$TMP/b/checkpoints"
  if [ -f "$ck/last" ]; then
    for d in "$ck"/step=*; do
      [ -d "$d" ] && [ ! -f "$d/COMMITTED" ] && [ "$(basename "$d")" != "$(cat "$ck/last")" ] && partial="$d"
    done
  fi
  [ -n "$partial" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.02
done
[ -n "$partial" ] || { kill -9 "$pid" 2>/dev/null || true; fail "never saw a half-written checkpoint"; }
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
[ ! -f "$partial/COMMITTED" ] || fail "the checkpoint finished before the kill"
before="$(cat "$TMP/b/checkpoints/last")"
echo "killed with $(basename "$partial") half written; last = $before"
"$LATHE" finetune "${ARGS[@]}" --run-dir "$TMP/b" >/dev/null 2>"$TMP/b2.log" || { cat "$TMP/b2.log" >&2; fail "resume b"; }
grep -q "removed .*$(basename "$partial")" "$TMP/b2.log" || fail "the partial checkpoint was not reported removed: $(cat "$TMP/b2.log")"
grep -q "resuming from .*$before at step" "$TMP/b2.log" || fail "did not resume from $before: $(cat "$TMP/b2.log")"
losses "$TMP/b/metrics.jsonl" >"$TMP/b.losses"
diff "$TMP/a.losses" "$TMP/b.losses" || fail "killed and resumed run differs from the uninterrupted one"

# ---- 3. stopped at step 8, resumed ----------------------------------------------
"$LATHE" finetune "${ARGS[@]}" --run-dir "$TMP/c" trainer.max_steps=8 checkpoint.async_save=false >/dev/null 2>"$TMP/c1.log" \
  || { cat "$TMP/c1.log" >&2; fail "run c, first half"; }
"$LATHE" finetune "${ARGS[@]}" --run-dir "$TMP/c" resume=auto >/dev/null 2>"$TMP/c2.log" || { cat "$TMP/c2.log" >&2; fail "run c, second half"; }
grep -q "at step 8" "$TMP/c2.log" || fail "run c did not resume at step 8"
losses "$TMP/c/metrics.jsonl" >"$TMP/c.losses"
diff "$TMP/a.losses" "$TMP/c.losses" || fail "stopped and resumed run differs from the uninterrupted one"

# ---- 4. last and top-k ------------------------------------------------------------
CK="$TMP/a/checkpoints"
last="$(cat "$CK/last")"
[ -f "$CK/$last/COMMITTED" ] || fail "last ($last) is not committed"
case "$last" in step=000012-val_loss=*) ;; *) fail "last is $last, expected step 12" ;; esac
n=$(find "$CK" -mindepth 1 -maxdepth 1 -type d | wc -l)
[ "$n" -le 3 ] || fail "$n checkpoints kept, save_top_k=2 + last allows 3"
for f in metadata.json model-rank00000.safetensors optim-rank00000.safetensors trainer_state.json recipe.yaml tokenizer.json; do
  [ -f "$CK/$last/$f" ] || fail "checkpoint has no $f"
done
[ -f "$TMP/a/adapter/adapter_model.safetensors" ] || fail "the run's adapter output is missing"

# ---- 5. corruption is refused, naming the file --------------------------------------
python3 - "$CK/$last/model-rank00000.safetensors" <<'EOF'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read()); b[-5] ^= 1; open(p, "wb").write(bytes(b))
EOF
if "$LATHE" finetune "${ARGS[@]}" --run-dir "$TMP/a" trainer.max_steps=14 optim.sched.max_steps=14 >/dev/null 2>"$TMP/bad.log"; then
  fail "a corrupt checkpoint was resumed from"
fi
grep -q "model-rank00000.safetensors" "$TMP/bad.log" || fail "the error does not name the file: $(cat "$TMP/bad.log")"
echo "checkpoint e2e: OK"
