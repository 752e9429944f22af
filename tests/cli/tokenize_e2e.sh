#!/usr/bin/env bash
# End-to-end checks of `lathe tokenize` and `lathe detokenize` on the real
# tokenizer files in ../shared/tokenizers: ids, special tokens, JSON and
# JSONL output, errors naming file:line, and text -> ids -> text round trips.
set -euo pipefail
LATHE="$1"
HERE="$(cd "$(dirname "$0")" && pwd)"
TOK="$HERE/../../../shared/tokenizers"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

fail() { echo "tokenize e2e: FAIL: $*" >&2; exit 1; }
expect_eq() { [[ "$1" == "$2" ]] || fail "$3: got [$1], want [$2]"; }

"$LATHE" tokenize --help | grep -q -- "--jsonl" || fail "tokenize --help lacks --jsonl"
"$LATHE" detokenize --help | grep -q -- "--skip-special-tokens" || fail "detokenize --help lacks --skip-special-tokens"

expect_eq "$("$LATHE" tokenize --tokenizer "$TOK/llama3" --text "Hello world")" "9906 1917" "llama3 ids"
expect_eq "$("$LATHE" tokenize --tokenizer "$TOK/mistral" --text "Hello world" --add-special-tokens)" "1 22557 1526" "mistral bos"
expect_eq "$("$LATHE" tokenize --tokenizer "$TOK/mistral" --text "Hello world")" "22557 1526" "mistral no bos"
"$LATHE" tokenize --tokenizer "$TOK/llama3" --text "Hello world" --json | grep -q '"tokens":\["Hello","Ġworld"\]' \
  || fail "--json tokens"

printf '%s\n' '"Hello world"' '"<|begin_of_text|>hi"' > "$TMP/in.jsonl"
expect_eq "$("$LATHE" tokenize --tokenizer "$TOK/llama3" --jsonl "$TMP/in.jsonl" | tr '\n' '|')" \
  "[9906,1917]|[128000,6151]|" "jsonl batch"

printf '%s\n' '"fine"' 'not json' > "$TMP/bad.jsonl"
set +e
err="$("$LATHE" tokenize --tokenizer "$TOK/llama3" --jsonl "$TMP/bad.jsonl" 2>&1 >/dev/null)"
rc=$?
set -e
[[ $rc -eq 2 ]] || fail "malformed jsonl exit code $rc"
[[ "$err" == *"bad.jsonl:2"* ]] || fail "malformed jsonl error lacks file:line: $err"

set +e
err="$("$LATHE" tokenize --tokenizer "$TMP/nowhere" --text x 2>&1)"
rc=$?
set -e
[[ $rc -ne 0 && "$err" == *"nowhere"* ]] || fail "missing tokenizer: rc=$rc err=$err"

expect_eq "$("$LATHE" detokenize --tokenizer "$TOK/llama3" --ids 9906,1917)" "Hello world" "detokenize --ids"
expect_eq "$(echo "[128000, 9906, 1917]" | "$LATHE" detokenize --tokenizer "$TOK/llama3" --skip-special-tokens)" \
  "Hello world" "detokenize stdin, skip specials"
expect_eq "$("$LATHE" detokenize --tokenizer "$TOK/llama3" --ids 128000,9906)" "<|begin_of_text|>Hello" "detokenize specials"

text=$'안녕하세요, 세계! 你好 😀👍🏽 code:\tx = 12345;'
printf '%s' "$text" > "$TMP/text.txt"
for name in llama3 qwen3 mistral gpt4o; do
  ids="$("$LATHE" tokenize --tokenizer "$TOK/$name" --text-file "$TMP/text.txt" --add-special-tokens)"
  back="$(echo "$ids" | "$LATHE" detokenize --tokenizer "$TOK/$name" --skip-special-tokens)"
  expect_eq "$back" "$text" "$name round trip"
done
echo "tokenize e2e: ok"
