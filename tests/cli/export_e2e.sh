#!/usr/bin/env bash
# `lathe export` and `lathe checkpoint` end to end: a short LoRA run on the
# tiny f32 model saves two checkpoints; list and inspect report them (steps,
# sizes that add up, committed, last); the `hf` export's logits equal
# `lathe logits --adapter` with the `hf-peft` export on the base model, bit for
# bit (one merge routine, f32), while the base alone differs; a full-SFT run
# exports exactly its trained weights (and refuses hf-peft); and a missing,
# uncommitted or corrupt checkpoint fails with a message naming it. When torch,
# transformers and peft are installed, tools/check_export.py also loads both
# exports with them and compares logits (<= 1e-4).
set -euo pipefail
LATHE="$1"
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
fail() { echo "export e2e: FAIL: $*" >&2; exit 1; }
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"

M="$TMP/model"
"$LATHE" init-model --preset tiny --out "$M" --seed 1 --dtype f32 >/dev/null
RUN="$TMP/run"
"$LATHE" finetune --model "$M" --data "$SRC/data/sample" --recipe "$SRC/recipes/tiny_lora.yaml" --run-dir "$RUN" \
  --progress lines trainer.max_steps=12 trainer.val_check_interval=6 peft.dim=8 peft.alpha=16 \
  checkpoint.save_top_k=-1 >/dev/null 2>"$TMP/progress" || { cat "$TMP/progress" >&2; fail "finetune failed"; }
CK="$RUN/checkpoints"

# ---- checkpoint list / inspect ----------------------------------------------------
"$LATHE" checkpoint list "$CK" >"$TMP/list.txt"
grep -q "step=000012.* 12 .*yes (last)" "$TMP/list.txt" || fail "list: $(cat "$TMP/list.txt")"
grep -q "step=000006.* 6 .*yes " "$TMP/list.txt" || fail "list: $(cat "$TMP/list.txt")"
"$LATHE" checkpoint list "$CK" --json >"$TMP/list.json"
python3 - "$TMP/list.json" <<'EOF' || fail "list --json"
import json, os, sys
items = json.load(open(sys.argv[1]))
assert [c["step"] for c in items] == [6, 12], items
assert all(c["committed"] for c in items) and [c["last"] for c in items] == [False, True], items
for c in items:
    files = [os.path.join(d, f) for d, _, fs in os.walk(c["location"]) for f in fs]
    assert c["total_bytes"] == sum(os.path.getsize(f) for f in files), (c, len(files))
    assert "val_loss" in c["metrics"], c
EOF
"$LATHE" checkpoint inspect "$CK" --json --verify >"$TMP/inspect.json"
python3 - "$TMP/inspect.json" "$M" <<'EOF' || fail "inspect --json"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["step"] == 12 and c["committed"] and c["last"] and c["verified"], c
assert c["kind"] == "lora" and c["lora"]["r"] == 8 and c["lora"]["alpha"] == 16, c
assert c["base_model"]["path"] == sys.argv[2], c
EOF
"$LATHE" checkpoint inspect "$CK/step=000006-val_loss"* | grep -q "^step  *6$" || fail "inspect of step 6"

# ---- export, and logits of the two exports agree ---------------------------------
"$LATHE" export --checkpoint "$CK" --target hf --out "$TMP/hf" >/dev/null
"$LATHE" export --checkpoint "$CK" --target hf-peft --out "$TMP/peft" >/dev/null
for f in config.json model.safetensors generation_config.json tokenizer.json tokenizer_config.json; do
  [ -f "$TMP/hf/$f" ] || fail "the hf export has no $f"
done
for f in adapter_config.json adapter_model.safetensors; do
  [ -f "$TMP/peft/$f" ] || fail "the hf-peft export has no $f"
done
python3 - "$TMP/ids.safetensors" <<'EOF'
import json, struct, sys
rows = [[512, 84, 104, 101, 32, 108, 97, 116], [512, 87, 104, 97, 116, 32, 105, 115]]
ids = [t for r in rows for t in r]
header = json.dumps({"input_ids": {"dtype": "I64", "shape": [2, 8], "data_offsets": [0, 8 * len(ids)]}}).encode()
header += b" " * (-len(header) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header + struct.pack("<%dq" % len(ids), *ids))
EOF
"$LATHE" logits --model "$M" --adapter "$TMP/peft" --input-ids "$TMP/ids.safetensors" --out "$TMP/adapted.safetensors" >/dev/null
"$LATHE" logits --model "$TMP/hf" --input-ids "$TMP/ids.safetensors" --out "$TMP/merged.safetensors" \
  --reference "$TMP/adapted.safetensors" --tolerance 0 >/dev/null || fail "hf export logits differ from base + hf-peft"
if "$LATHE" logits --model "$M" --input-ids "$TMP/ids.safetensors" --out "$TMP/base.safetensors" \
  --reference "$TMP/adapted.safetensors" --tolerance 1e-4 >/dev/null 2>&1; then
  fail "the base model alone gave the adapted logits: the trained adapter changes nothing"
fi

# ---- full SFT: the trained weights are exported as they are ------------------------
"$LATHE" finetune --model "$M" --data "$SRC/data/sample" --recipe "$SRC/recipes/tiny_lora.yaml" --run-dir "$TMP/full" \
  --progress lines trainer.max_steps=2 trainer.val_check_interval=2 peft.peft_scheme=none optim.lr=0.0005 \
  optim.sched.warmup_steps=1 >/dev/null 2>"$TMP/progress" || { cat "$TMP/progress" >&2; fail "full SFT finetune failed"; }
"$LATHE" checkpoint inspect "$TMP/full/checkpoints" | grep -q "full SFT" || fail "inspect does not say full SFT"
"$LATHE" export --checkpoint "$TMP/full/checkpoints" --target hf --out "$TMP/full_hf" >/dev/null
python3 - "$TMP/full_hf/model.safetensors" "$TMP/full/model/model.safetensors" "$M/model.safetensors" <<'EOF' \
  || fail "the full-SFT export is not the run's trained weights"
import sys
from safetensors.numpy import load_file
out, trained, base = (load_file(p) for p in sys.argv[1:4])
assert out.keys() == trained.keys() == base.keys()
assert all((out[k] == trained[k]).all() for k in out)
assert any((out[k] != base[k]).any() for k in out)
EOF
if "$LATHE" export --checkpoint "$TMP/full/checkpoints" --target hf-peft --out "$TMP/x" 2>"$TMP/err"; then
  fail "hf-peft export of a full-SFT run was accepted"
fi
grep -q "use --target hf" "$TMP/err" || fail "full SFT hf-peft error: $(cat "$TMP/err")"

# ---- errors name what is wrong ----------------------------------------------------
expect_error() {  # expect_error PATTERN lathe-args...
  local pattern="$1"; shift
  if "$LATHE" "$@" >/dev/null 2>"$TMP/err"; then fail "accepted: $*"; fi
  grep -q -- "$pattern" "$TMP/err" || fail "'$*' error does not name '$pattern': $(cat "$TMP/err")"
}
expect_error "$TMP/nowhere" export --checkpoint "$TMP/nowhere" --target hf --out "$TMP/x"
expect_error "hf or hf-peft" export --checkpoint "$CK" --target gguf --out "$TMP/x"
cp -r "$CK/step=000012-val_loss"* "$TMP/ck2"
U="$TMP/ck2"
rm "$U/COMMITTED"
expect_error "not committed" export --checkpoint "$U" --target hf --out "$TMP/x"
"$LATHE" checkpoint inspect "$U" | grep -q "^committed  *no" || fail "inspect calls an uncommitted checkpoint committed"
mv "$U" "$CK/step=000018"  # a save cut short under the root: listed, marked, not `last`
"$LATHE" checkpoint list "$CK" >"$TMP/list.txt"
grep -q "^step=000018 .* NO " "$TMP/list.txt" || fail "list does not mark the uncommitted one: $(cat "$TMP/list.txt")"
grep -q "step=000012.*yes (last)" "$TMP/list.txt" || fail "list: $(cat "$TMP/list.txt")"
rm -rf "$CK/step=000018"
cp -r "$CK/step=000006-val_loss"* "$TMP/ck3"
python3 - "$TMP/ck3/model-rank00000.safetensors" <<'EOF'
import os, sys
with open(sys.argv[1], "r+b") as f:
    f.seek(os.path.getsize(sys.argv[1]) - 5)
    b = f.read(1)
    f.seek(-1, 1)
    f.write(bytes([b[0] ^ 0xFF]))
EOF
expect_error "model-rank00000.safetensors" export --checkpoint "$TMP/ck3" --target hf-peft --out "$TMP/x"
expect_error "model-rank00000.safetensors" checkpoint inspect "$TMP/ck3" --verify
[ ! -e "$TMP/x" ] || fail "a failed export left $TMP/x behind"

# ---- against transformers and peft, where installed -------------------------------
if python3 -c "import torch, transformers, peft" 2>/dev/null; then
  python3 "$SRC/tools/check_export.py" --lathe "$LATHE" --base "$M" --hf "$TMP/hf" --peft "$TMP/peft" 2>/dev/null \
    || fail "tools/check_export.py"
else
  echo "export e2e: torch/transformers/peft not installed; skipping tools/check_export.py"
fi
echo "export e2e: ok"
