# What every demo shares (scripts/demo*.sh source it). A demo sets ONEHOP
# (the binary) and LAB (the lab's name, as in its topology file) first.
#
# Demos show; the e2e tests (test/e2e) assert. A demo stops loudly when a
# step it shows fails (set -e, or "failed"), and says "LEAK" when something
# it shows being refused gets through; it does not re-check figures (counters,
# hop lists, captured packets), which the e2e test named beside each step
# checks.
#
# Sourcing it sets -eEuo pipefail: a command that fails outside a test
# (if, ||) stops the demo with FAILED and the demo's line that ran it.
set -eEuo pipefail
demo_err() {
  # In a subshell ($(...), &) only leave: the shell that waits on it decides.
  [ "$BASHPID" = "$$" ] || exit "$1"
  # The outermost frame is the demo's own step, whatever helper failed.
  local n=${#BASH_SOURCE[@]}
  local file=${BASH_SOURCE[n-1]} line=${BASH_LINENO[n-2]}
  printf '\n\033[31mFAILED (exit %s): %s line %s: %s\033[0m\n' "$1" "$file" "$line" "$(sed -n "${line}s/^ *//p" "$file")" >&2
  exit 1
}
trap 'demo_err $?' ERR

# Every demo creates namespaces and loads eBPF; scripts/NAME.sh is `make NAME`.
if [ "$(id -u)" -ne 0 ]; then
  echo "$(basename "$0" .sh): needs root (it creates network namespaces and loads eBPF); try: sudo make $(basename "$0" .sh)" >&2
  exit 1
fi

STATE=/run/onehop/$LAB
API=$STATE/api.sock
METRICS_PORT=9100 # internal/lab.MetricsPort: each agent's /metrics

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
ok() { printf '   \033[32mok:\033[0m %s\n' "$*"; }
blocked() { printf '   \033[32mblocked, as expected:\033[0m %s\n' "$*"; }
note() { printf '   %s\n' "$*"; }
leak() { printf '\n\033[31mLEAK: %s\033[0m\n' "$*" >&2; exit 1; }
failed() { printf '\n\033[31mFAILED: %s\033[0m\n' "$*" >&2; exit 1; }

# on NODE CMD...: CMD inside a node of the lab.
on() { local node=$1; shift; "$ONEHOP" lab exec --lab "$LAB" "$node" -- "$@"; }
# von NODE CMD...: "on", printed as a reader would type it first.
von() { printf '$ onehop lab exec %s -- %s\n' "$1" "${*:2}"; on "$@"; }
# vin NODE CMD...: "von", with CMD's output indented under it.
vin() { printf '$ onehop lab exec %s -- %s\n' "$1" "${*:2}"; on "$@" | sed 's/^/   /'; }
# show CMD...: print a command, then run it.
show() { printf '$ %s\n' "$*"; "$@"; }
# op VERB...: an operator verb against this lab's controller.
op() { printf '$ onehop %s\n' "$*"; "$ONEHOP" "$@" --api "$API"; }

# lab_up TOPO WHAT: brings the lab up from TOPO, taking down first a lab of
# the same name that is up, so the demo starts from the topology file.
lab_up() {
  if "$ONEHOP" lab status --lab "$LAB" >/dev/null 2>&1; then
    say "Lab $LAB is already up; rebuilding it so the demo starts from the topology file"
    "$ONEHOP" lab down --lab "$LAB" >/dev/null
  fi
  say "Building $2 from $1"
  show "$ONEHOP" lab up "$1"
}

# lab_down_quietly: what a demo that tears its lab down runs at exit,
# however it ends.
lab_down_quietly() { "$ONEHOP" lab down --lab "$LAB" >/dev/null 2>&1 || true; }

# BG: processes the demo started in the background; stop_bg kills them.
BG=()
stop_bg() {
  local p
  for p in "${BG[@]}"; do kill "$p" 2>/dev/null || true; done
  BG=()
}

# iface NODE IFACE addr|mac: from lab status, read inside the node's
# namespace. A bridge lab keeps a host's address on its bridge br0.
iface() {
  "$ONEHOP" lab status --lab "$LAB" -o json | python3 -c '
import json, sys
node, ifc, what = sys.argv[1:4]
n = [n for n in json.load(sys.stdin)["nodes"] if n["name"] == node][0]
byname = {i["name"]: i for i in n["interfaces"]}
i = byname[ifc]
addrs = i["addrs"] or byname.get("br0", {}).get("addrs", [])
print(i["mac"] if what == "mac" else addrs[0].split("/")[0])' "$1" "$2" "$3"
}

# metric HOST NAME [LABEL]: HOST's agent metric NAME, summed over the series
# whose labels hold LABEL (e.g. 'reason="not_visible"'); 0 if none.
metric() {
  on "$1" curl -sf "localhost:$METRICS_PORT/metrics" |
    awk -v name="$2" -v label="${3:-}" '
      (index($0, name "{") == 1 || index($0, name " ") == 1) && index($0, label) { n += $NF }
      END { print n + 0 }'
}
drops() { metric "$1" onehop_dropped_packets_total "reason=\"$2\""; }
fwds() { metric "$1" onehop_forwarded_packets_total "path=\"$2\""; }

# counted BEFORE HOST REASON: shows how REASON's drop counter on HOST moved
# since BEFORE (the e2e test named at the step asserts that it rose).
counted() { note "counter: $3 drops on $2 $1 -> $(drops "$2" "$3")"; }

# listen NODE PORT: a TCP listener (iperf3) in NODE that ends by itself
# after 60 s; returns once it listens.
listen() {
  # Not through "on": $! must be the process itself.
  "$ONEHOP" lab exec --lab "$LAB" "$1" -- timeout 60 iperf3 -s -p "$2" >/dev/null 2>&1 &
  BG+=("$!")
  wait_listening "$1" "$2"
}

# wait_listening NODE PORT: waits (5 s at most) until something in NODE
# listens on TCP PORT.
wait_listening() {
  local _
  for _ in $(seq 50); do
    on "$1" ss -Hltn "sport = :$2" | grep -q . && return 0
    sleep 0.1
  done
  failed "nothing listens in $1 on port $2"
}

# elapsed: seconds since the demo sourced this file.
DEMO_STARTED=$(date +%s)
elapsed() { echo $(($(date +%s) - DEMO_STARTED)); }
