#!/usr/bin/env bash
# `lathe chat-template` end to end: renders with the real Qwen3 template and
# compares byte for byte with transformers' output (fixtures made by
# tools/make_chat_template_fixtures.py); checks the error paths' exit codes.
set -euo pipefail
LATHE="$1"
HERE="$(cd "$(dirname "$0")" && pwd)"
DATA="$HERE/../data/chat_templates"
TOK="$HERE/../../../shared/tokenizers"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

if [ -d "$TOK/qwen3" ]; then
  "$LATHE" chat-template --tokenizer "$TOK/qwen3" --messages "$DATA/cli_messages.json" \
    --var enable_thinking=false >"$OUT/gen.txt"
  cmp "$OUT/gen.txt" "$DATA/cli_expected_qwen3_gen.txt"
  "$LATHE" chat-template --tokenizer "$TOK/qwen3" --messages "$DATA/cli_messages.json" \
    --no-generation-prompt --var enable_thinking=false >"$OUT/nogen.txt"
  cmp "$OUT/nogen.txt" "$DATA/cli_expected_qwen3_nogen.txt"
fi

# A template file with the special tokens of a tokenizer that has no template.
if [ -d "$TOK/mistral" ]; then
  printf '[{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]' >"$OUT/ok.json"
  "$LATHE" chat-template --tokenizer "$TOK/mistral" --template "$DATA/mistral_inst.jinja" \
    --messages "$OUT/ok.json" >"$OUT/inst.txt"
  printf '<s>[INST] S\n\nU [/INST]' | cmp - "$OUT/inst.txt"
fi

# A template's raise_exception reaches the user with exit code 2.
printf '[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]' >"$OUT/bad.json"
set +e
"$LATHE" chat-template --template "$DATA/mistral_inst.jinja" --messages "$OUT/bad.json" 2>"$OUT/err.txt"
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "expected exit 2, got $rc"; exit 1; }
grep -q "Conversation roles must alternate" "$OUT/err.txt"

# A syntax error names its line.
printf 'ok\n{%% if %%}' >"$OUT/broken.jinja"
if "$LATHE" chat-template --template "$OUT/broken.jinja" --messages "$OUT/bad.json" 2>"$OUT/err2.txt"; then
  echo "broken template rendered"; exit 1
fi
grep -q "line 2" "$OUT/err2.txt"
echo "chat-template e2e: ok"
