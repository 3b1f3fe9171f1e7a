#!/usr/bin/env bash
# Runs every fuzz target in the module briefly (FUZZTIME each, default 10000
# executions). A fuzzing run takes one target, so they are found and run one
# by one; a new Fuzz function needs no registration here.
#
# Each package's test binary is built once, instrumented for coverage as
# `go test -fuzz` builds it (`go test -c -fuzz`), and run once per target
# in the package's directory, as go test runs it: it reads the seeds in
# testdata/fuzz/NAME and writes a failing input there. (`go test -fuzz` per
# target relinked the binary each time: most of the run's time.)
#
# A count, not a duration: Go 1.26's fuzz coordinator can fail a target with
# a bare "context deadline exceeded" when a -fuzztime duration runs out while
# a worker is mid-input (go.dev/issue/75804, fixed in Go 1.27), which a
# loaded CI machine hits. A count has no deadline to race.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-10000x}
work=$(mktemp -d "${TMPDIR:-/tmp}/onehop-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
# Where go test -fuzz keeps what it generated, per import path: the next
# run starts from it.
cache=$($GO env GOCACHE)/fuzz/$($GO list -m)
found=0
while IFS=: read -r file name; do
  dir=$(dirname "$file")
  bin=$work/${dir//\//_}.test
  if [ ! -x "$bin" ]; then
    $GO test -c -fuzz . -o "$bin" "./$dir" || { echo "fuzz: ./$dir: its test binary does not build" >&2; exit 1; }
  fi
  found=$((found + 1))
  echo "fuzz: $name (./$dir, $FUZZTIME)"
  (cd "$dir" && "$bin" -test.run '^$' -test.fuzz "^${name}\$" -test.fuzztime "$FUZZTIME" \
    -test.fuzzcachedir "$cache/$dir" -test.paniconexit0 -test.timeout 10m) >"$work/out" 2>&1 || {
    cat "$work/out" >&2
    echo "fuzz: $name found a failing input (saved under ./$dir/testdata/fuzz/$name)" >&2
    exit 1
  }
done < <(grep -rHoE '^func (Fuzz[A-Za-z0-9_]+)' --include='*_test.go' internal cmd | sed -E 's/:func /:/' | sort -u)
echo "fuzz: $found targets ran without finding a failure"
