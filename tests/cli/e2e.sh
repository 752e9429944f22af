#!/usr/bin/env bash
# End-to-end CLI checks: runs the lathe binary the way a user does.
set -euo pipefail
LATHE="$1"
"$LATHE" --help >/dev/null
"$LATHE" version | grep -q lathe
echo "cli e2e: ok"
