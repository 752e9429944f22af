# Shared by checkpoint_e2e.sh and checkpoint_s3_e2e.sh (sourced; needs LATHE,
# SRC and TMP set): the tiny model, the run's arguments, and losses().

M="$TMP/tiny"
"$LATHE" init-model --preset tiny --out "$M" --seed 1 --dtype f32 >/dev/null
# On the CPU, also where a GPU is present: these runs compare losses bit for
# bit (the GPU's resume is checked in cuda_resume_e2e.sh and cuda_dropout_e2e.sh).
ARGS=(--model "$M" --data "$SRC/data/sample" --progress lines --device cpu
      peft.dim=8 peft.alpha=16 peft.dropout=0.1 trainer.max_steps=12 trainer.val_check_interval=4
      data.seq_length=128 data.micro_batch_size=5 data.global_batch_size=10 optim.lr=0.003
      optim.sched.warmup_steps=2 optim.sched.max_steps=12 checkpoint.every_n_train_steps=2 checkpoint.save_top_k=2)

# Train and validation losses of a run, one "kind step value" per line, exactly as written.
losses() {
  python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "val_loss" in r: print("val", r["step"], repr(r["val_loss"]))
    else: print("train", r["step"], repr(r["loss"]))
PY
}
