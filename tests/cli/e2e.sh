#!/usr/bin/env bash
# End-to-end CLI checks: runs the lathe binary the way a user does.
set -euo pipefail
LATHE="$1"
"$LATHE" --help >/dev/null
"$LATHE" version | grep -q lathe
echo "cli e2e: ok"
# inspect reads the tokenizer that init-model writes.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$LATHE" init-model --preset tiny --out "$tmp/m" --seed 7 >/dev/null
"$LATHE" inspect "$tmp/m" | grep -Eq '^tokenizer +517 tokens \(bos <\|begin_of_text\|>'
"$LATHE" inspect "$tmp/m" --json | grep -q '"vocab_size": 517'
echo "tokenizer.json is broken" > "$tmp/m/tokenizer.json"
"$LATHE" inspect "$tmp/m" | grep -q 'tokenizer.json does not load'
echo "cli e2e (inspect): ok"
