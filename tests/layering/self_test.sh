#!/usr/bin/env bash
# The layering test must fail on a forbidden include: a copy of ARCHITECTURE.md and a drain/
# header that includes proxy/ in a scratch tree, then the same tree with the include allowed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$root/ARCHITECTURE.md" "$tmp/"
mkdir -p "$tmp/drain" "$tmp/proxy" "$tmp/model"
echo '#include "proxy/conntrack.h"' >"$tmp/drain/bad.h"
echo '#include "model/ip.h"' >"$tmp/proxy/conntrack.h"
echo '#pragma once' >"$tmp/model/ip.h"
if out=$(python3 "$here/check_layering.py" "$tmp"); then
  echo "FAIL: a drain/ -> proxy/ include was not reported"; exit 1
fi
grep -q "drain/bad.h:1: drain/ may not include proxy/" <<<"$out" || { echo "FAIL: $out"; exit 1; }
rm "$tmp/drain/bad.h"
python3 "$here/check_layering.py" "$tmp" >/dev/null || { echo "FAIL: a clean tree was refused"; exit 1; }
echo "PASS: a forbidden include is reported and a clean tree passes"
