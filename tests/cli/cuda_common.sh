# Shared by the GPU end-to-end scripts (sourced; needs LATHE, TMP and the
# functions skip and fail): skips without a visible GPU, then writes the
# tiny preset regrouped to head_dim 64 into $M (2 heads of 64 over hidden
# 128, 1 KV head: the same tensors, only config.json changes; weights in
# bf16 so CPU and GPU start from the very same base) and skips when this
# lathe has no CUDA backend or sees no device.

command -v nvidia-smi >/dev/null 2>&1 || skip "no nvidia-smi"
nvidia-smi -L 2>/dev/null | grep -q "^GPU" || skip "nvidia-smi -L lists no GPU"

M="$TMP/tiny64"
"$LATHE" init-model --preset tiny --out "$M" --seed 1 --dtype bf16 >/dev/null
python3 - "$M/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
assert c["hidden_size"] == 128 and c["num_attention_heads"] * c["head_dim"] == 128, c
assert c["num_key_value_heads"] * c["head_dim"] == 64, c
c.update(num_attention_heads=2, num_key_value_heads=1, head_dim=64)
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
if ! "$LATHE" generate --model "$M" --prompt-ids 1,2,3 --max-new-tokens 1 --device cuda --json >/dev/null 2>"$TMP/err"; then
  grep -q "no CUDA backend\|no CUDA device is visible" "$TMP/err" && skip "$(cat "$TMP/err")"
  fail "generate --device cuda on the head_dim-64 model: $(cat "$TMP/err")"
fi
