#!/usr/bin/env bash
# Runs every fuzz target in the module briefly (FUZZTIME each, default 10000
# executions): go test -fuzz takes one target per run, so they are found and
# run one by one. A new Fuzz function needs no registration here.
#
# A count, not a duration: Go 1.26's fuzz coordinator can fail a target with
# a bare "context deadline exceeded" when a -fuzztime duration runs out while
# a worker is mid-input (go.dev/issue/75804, fixed in Go 1.27), which a
# loaded CI machine hits. A count has no deadline to race.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-10000x}
found=0
while IFS=: read -r file name; do
  pkg="./$(dirname "$file")"
  found=$((found + 1))
  echo "fuzz: $name ($pkg, $FUZZTIME)"
  $GO test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$pkg" >/tmp/onehop-fuzz.$$ 2>&1 || {
    cat /tmp/onehop-fuzz.$$ >&2; rm -f /tmp/onehop-fuzz.$$
    echo "fuzz: $name found a failing input (saved under $pkg/testdata/fuzz/$name)" >&2
    exit 1
  }
done < <(grep -rHoE '^func (Fuzz[A-Za-z0-9_]+)' --include='*_test.go' internal cmd | sed -E 's/:func /:/' | sort -u)
rm -f /tmp/onehop-fuzz.$$
echo "fuzz: $found targets ran without finding a failure"
