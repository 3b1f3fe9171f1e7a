#!/usr/bin/env bash
# The virtual TAP demo: builds examples/tap.yaml (web1 on h1 talks to web2
# on h2; mon1, the monitor, on h2; two TAP policies from the file), shows
# that tcpdump on mon1 sees exactly the packets the policies name (web1's
# pings to web2, web1's TCP to web2's iperf3 port) and nothing else (not
# the replies, not web1's pings to web3), prints `onehop tap list` and the
# per-policy counters, then tears the lab down.
#
# A copy where none is due stops the demo with "LEAK"; a copy that is due
# and missing stops it with "FAILED".
set -euo pipefail
ONEHOP=${1:-bin/onehop}
TOPO=${2:-examples/tap.yaml}
LAB=tap
STATE=/run/onehop/$LAB

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
ok() { printf '   \033[32mok:\033[0m %s\n' "$*"; }
leak() { printf '\n\033[31mLEAK: %s\033[0m\n' "$*" >&2; exit 1; }
failed() { printf '\n\033[31mFAILED: %s\033[0m\n' "$*" >&2; exit 1; }
on() { local node=$1; shift; "$ONEHOP" lab exec --lab "$LAB" "$node" -- "$@"; }
von() { printf '$ onehop lab exec %s -- %s\n' "$1" "${*:2}"; on "$@"; }
op() { printf '$ onehop %s\n' "$*"; "$ONEHOP" "$@" --api "$STATE/api.sock"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "demo-tap: needs root (it creates network namespaces and loads eBPF); try: sudo make demo-tap" >&2
  exit 1
fi
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  "$ONEHOP" lab down --lab "$LAB" >/dev/null 2>&1 || true
}
trap cleanup EXIT
started=$(date +%s)

if "$ONEHOP" lab status --lab "$LAB" >/dev/null 2>&1; then
  say "Lab $LAB is already up; rebuilding it so the demo starts from the topology file"
  "$ONEHOP" lab down --lab "$LAB" >/dev/null
fi
say "Building the TAP lab from $TOPO"
printf '$ onehop lab up %s\n' "$TOPO"
"$ONEHOP" lab up "$TOPO" | tail -3

# addr VM: the VM's address, read inside its namespace.
addr() { on "$1" ip -4 -br addr show eth0 | awk '{print $3}' | cut -d/ -f1; }
# fwds HOST PATH: the host's forwarded-packets counter for PATH.
fwds() {
  on "$1" curl -sf localhost:9100/metrics |
    awk -v r="path=\"$2\"" 'index($0, "onehop_forwarded_packets_total{") == 1 && index($0, r) { n += $NF } END { print n + 0 }'
}
WEB1=$(addr web1); WEB2=$(addr web2); WEB3=$(addr web3); MON1=$(addr mon1)

say "The policies, from the topology file's taps: (one way: sender -> receiver)"
op tap list

# A policy reaches every host within a second: ping until h2 has restored
# a copy for mon1 (this also proves the path before the capture starts).
for i in $(seq 50); do
  [ "$(fwds h2 tap_copy_recovered)" -gt 0 ] && break
  on web1 ping -c 1 -W 1 "$WEB2" >/dev/null 2>&1 || true
  [ "$i" -eq 50 ] && failed "no copy reached mon1's host within 50 pings"
done
ok "the policies are on h1 (sender's edge) and h2 (monitor's edge)"

say "tcpdump on the monitor, mon1 ($MON1, on h2): what it receives is what the policies copy"
PCAP=$STATE/demo-mon1.pcap
rm -f "$PCAP" "$STATE/demo-tcpdump.err"
printf '$ onehop lab exec mon1 -- tcpdump -ni eth0 -s 128 -U -w %s &\n' "$PCAP"
"$ONEHOP" lab exec --lab "$LAB" mon1 -- timeout 120 tcpdump -ni eth0 -s 128 -U -w "$PCAP" 2>"$STATE/demo-tcpdump.err" &
TCPDUMP=$!
PIDS+=("$TCPDUMP")
for _ in $(seq 100); do
  grep -q 'listening on' "$STATE/demo-tcpdump.err" 2>/dev/null && break
  sleep 0.1
done
grep -q 'listening on' "$STATE/demo-tcpdump.err" || failed "tcpdump on mon1 did not start: $(cat "$STATE/demo-tcpdump.err")"

say "web1 ($WEB1, h1) pings web2 ($WEB2, h2) 5 times, and web3 ($WEB3, h1) 3 times"
out=$(von web1 ping -c 5 -i 0.2 -W 1 "$WEB2") || failed "web1 cannot ping web2: $out"
grep -o '[0-9]* packets transmitted.*loss' <<<"$out" | sed 's/^/   /'
out=$(von web1 ping -c 3 -i 0.2 -W 1 "$WEB3") || failed "web1 cannot ping web3: $out"
grep -o '[0-9]* packets transmitted.*loss' <<<"$out" | sed 's/^/   /'

say "web1 sends to web2's iperf3 for 2 s (TCP port 5201, 200 Mbit/s)"
on web2 iperf3 -s -1 -D
for _ in $(seq 50); do on web2 ss -Hltn 'sport = :5201' | grep -q . && break; sleep 0.1; done
printf '$ onehop lab exec web1 -- iperf3 -c %s -t 2 -b 200M\n' "$WEB2"
on web1 iperf3 -c "$WEB2" -t 2 -b 200M | grep -E 'sender|receiver' | sed 's/^/   /' ||
  failed "iperf3 from web1 to web2 failed"

# Let the last copies land, then stop the capture (tcpdump writes -U: each
# packet as it comes).
for _ in $(seq 20); do
  [ -s "$PCAP" ] && break
  sleep 0.1
done
sleep 0.5
kill "$TCPDUMP" 2>/dev/null || true
wait "$TCPDUMP" 2>/dev/null || true
PIDS=()
ended=$(date +%H:%M:%S)

say "What mon1 received"
printf '$ tcpdump -nr %s icmp   # the ping copies\n' "$PCAP"
tcpdump -nr "$PCAP" icmp 2>/dev/null | sed 's/^/   /'
count() { tcpdump -nr "$PCAP" "$1" 2>/dev/null | wc -l || failed "tcpdump cannot read $PCAP with filter '$1'"; }
requests=$(count "icmp[icmptype] == icmp-echo and src host $WEB1 and dst host $WEB2")
replies=$(count "icmp[icmptype] == icmp-echoreply")
to_web3=$(count "host $WEB3")
tcp_to=$(count "tcp and src host $WEB1 and dst host $WEB2 and dst port 5201")
tcp_back=$(count "tcp and src host $WEB2")
printf '$ tcpdump -nr %s tcp | head -3   # the iperf3 copies\n' "$PCAP"
# (head closes the pipe early: tcpdump's SIGPIPE is no failure here)
tcpdump -nr "$PCAP" tcp 2>/dev/null | head -3 | sed 's/^/   /' || true
[ "$requests" -eq 5 ] || failed "mon1 received $requests copies of web1's 5 echo requests to web2, want 5"
ok "5 of 5 echo requests web1 -> web2, each once, as web2 received them"
[ "$replies" -eq 0 ] || leak "mon1 received $replies echo replies: the policies are one way"
[ "$to_web3" -eq 0 ] || leak "mon1 received $to_web3 packets of web1 and web3: no policy names web3"
ok "no echo replies, nothing of web1 <-> web3: no policy names them"
[ "$tcp_to" -gt 0 ] || failed "mon1 received no copy of web1's TCP to web2:5201"
[ "$tcp_back" -eq 0 ] || leak "mon1 received $tcp_back TCP segments from web2: the policy is one way"
ok "$tcp_to TCP packets web1 -> web2:5201 (GSO superpackets, as web1's vif sent them), none of web2's answers"

say "Per-policy counters: copies made at h1 (the sender's edge), delivered at h2 (the monitor's)"
# Agents publish their status (and counters) at every reconcile, at least
# every 2 s: wait until both have published since the traffic ended.
for _ in $(seq 100); do
  st=$("$ONEHOP" stats --api "$STATE/api.sock")
  awk -v end="$ended" '/^[^ ].* applied .* at / { n++; if ($NF > end) fresh++ } END { exit !(n == 2 && fresh == 2) }' <<<"$st" && break
  sleep 0.1
done
printf '$ onehop stats | grep -E "^[^ ]|tap "\n'
"$ONEHOP" stats --api "$STATE/api.sock" | grep -E '^[^ ]|  tap ' | sed 's/^/   /'
printf '   (web-ping: the 5 pings and the probe pings that showed the policies had arrived; web-iperf: mon1 captured %s)\n' "$tcp_to"

say "All shown in $(( $(date +%s) - started )) s; tearing the lab down"
rm -f "$PCAP" "$STATE/demo-tcpdump.err"
printf '$ onehop lab down --lab %s\n' "$LAB"
"$ONEHOP" lab down --lab "$LAB"
trap - EXIT
