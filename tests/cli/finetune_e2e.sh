#!/usr/bin/env bash
# End to end for `lathe finetune`, the README's main job: LoRA on the built-in
# tiny model with the bundled sample data and recipes/tiny_lora.yaml must drive
# the training loss below 0.05, write the run directory's outputs, and then
# greedy generation with the adapter must reproduce trained answers exactly
# (one English, one Korean). Also checks that bad input fails with a message
# naming the key or the file:line.
# Generation uses `lathe generate --adapter` when the binary has it; otherwise
# the adapter is merged into a copy of the model (W += scale · B·A, numpy) and
# generated from without --adapter, which checks the same trained weights.
set -euo pipefail
LATHE="$1"
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
fail() { echo "finetune e2e: FAIL: $*" >&2; exit 1; }
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"

# ---- bad input: non-zero exit, message names the key / file:line -----------------
if ! "$LATHE" init-model --help 2>/dev/null | grep -q -- "--preset"; then
  echo "finetune e2e: SKIP: this lathe has no init-model --preset (the tiny model comes from it)"
  exit 0
fi
M="$TMP/tiny"
"$LATHE" init-model --preset tiny --out "$M" --seed 1 --dtype f32 >/dev/null
if "$LATHE" finetune --model "$M" --data "$SRC/data/sample" --run-dir "$TMP/bad" peft.dimm=4 2>"$TMP/err"; then
  fail "an unknown key was accepted"
fi
grep -q "peft.dimm" "$TMP/err" || fail "unknown-key error does not name the key: $(cat "$TMP/err")"
printf '{"input": "a", "output": "b"}\n{"input": "a"\n' >"$TMP/broken.jsonl"
if "$LATHE" finetune --model "$M" --data "$TMP/broken.jsonl" --run-dir "$TMP/bad" 2>"$TMP/err"; then
  fail "a malformed data line was accepted"
fi
grep -q "broken.jsonl:2" "$TMP/err" || fail "data error does not name file:line: $(cat "$TMP/err")"
if "$LATHE" finetune --model "$TMP/missing" --data "$SRC/data/sample" --run-dir "$TMP/bad" 2>"$TMP/err"; then
  fail "a missing model was accepted"
fi
"$LATHE" finetune --help | grep -q "optim.sched.warmup_steps" || fail "--help does not list the recipe keys"

# ---- the main job ----------------------------------------------------------------
RUN="$TMP/run"
start=$(date +%s)
"$LATHE" finetune --model "$M" --data "$SRC/data/sample" --recipe "$SRC/recipes/tiny_lora.yaml" \
  --run-dir "$RUN" --progress lines >"$TMP/summary" 2>"$TMP/progress" || { cat "$TMP/progress" >&2; fail "finetune failed"; }
echo "finetune took $(( $(date +%s) - start )) s"
for f in metrics.jsonl loss_curves.svg recipe.yaml adapter/adapter_config.json adapter/adapter_model.safetensors; do
  [ -f "$RUN/$f" ] || fail "the run directory has no $f"
done
grep -q -- "--adapter $RUN/adapter" "$TMP/summary" || fail "the summary does not say where the adapter is"
python3 - "$RUN/metrics.jsonl" <<'EOF' || fail "metrics check"
import json, sys
train, val = [], []
for line in open(sys.argv[1]):
    r = json.loads(line)
    (val if "val_loss" in r else train).append(r)
for r in train:
    assert {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s"} <= r.keys(), r
assert val and all("perplexity" in r for r in val), "no validation records"
first, last = train[0]["loss"], train[-1]["loss"]
print(f"train loss {first:.4f} -> {last:.4f} over {len(train)} steps; last val_loss {val[-1]['val_loss']:.4f}")
assert last < 0.05, f"final training loss {last} is not below 0.05"
EOF

# ---- generation with the adapter reproduces trained answers ----------------------
if "$LATHE" generate --help 2>/dev/null | grep -q -- "--adapter"; then
  GEN=(--model "$M" --adapter "$RUN/adapter")
else
  python3 - "$M" "$RUN/adapter" "$TMP/merged" <<'EOF' || fail "merging the adapter"
import json, math, os, shutil, sys
import numpy as np
from safetensors.numpy import load_file, save_file
base, adapter, out = sys.argv[1:4]
shutil.copytree(base, out)
cfg = json.load(open(os.path.join(adapter, "adapter_config.json")))
r = cfg["r"]
scale = cfg["lora_alpha"] / (math.sqrt(r) if cfg.get("use_rslora") else r)
w = load_file(os.path.join(base, "model.safetensors"))
a = load_file(os.path.join(adapter, "adapter_model.safetensors"))
n = 0
for key, A in a.items():
    if ".lora_A." not in key:
        continue
    B = a[key.replace(".lora_A.", ".lora_B.")]
    target = key.replace("base_model.model.", "", 1).replace(".lora_A.weight", ".weight")
    w[target] = (w[target].astype(np.float32) + scale * (B @ A)).astype(w[target].dtype)
    n += 1
assert n > 0, "no LoRA tensors in the adapter"
save_file(w, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
EOF
  GEN=(--model "$TMP/merged")
fi
# The prompt is the bare question, no trailing space: the template's separator
# ("{input} {output}") is trained as the answer's first character, so the
# model generates it and the reply starts with one space.
check_answer() {  # $1: the question, as in data/sample/training.jsonl
  local want got
  want=$(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["input"] == sys.argv[2]: print(r["output"])' "$SRC/data/sample/training.jsonl" "$1")
  [ -n "$want" ] || fail "no training record asks '$1'"
  got=$("$LATHE" generate "${GEN[@]}" --prompt "$1" --temperature 0 --max-new-tokens 160)
  [ "${got:0:1}" = " " ] || fail "for '$1' the reply does not start with the trained separator space: '$got'"
  got="${got# }"
  [ "$got" = "$want" ] || fail "for '$1' generated '$got', trained '$want'"
  echo "ok: $1 -> $got"
}
check_answer "What is the daily ATM withdrawal limit?"
check_answer "지점 영업시간은 어떻게 되나요?"
echo "finetune e2e: ok"
