#!/usr/bin/env bash
# The virtual TAP demo: builds examples/tap.yaml (web1 on h1 talks to web2
# on h2; mon1, the monitor, on h2; two TAP policies from the file), shows
# that tcpdump on mon1 sees exactly the packets the policies name (web1's
# pings to web2, web1's TCP to web2's iperf3 port) and nothing else (not
# the replies, not web1's pings to web3), prints `onehop tap list` and the
# per-policy counters, then tears the lab down.
#
# A step that fails stops the demo with "FAILED". The demo shows the
# capture; TestPrivilegedTapCopiesExactlyTheMatchingPacketsToLocalAndRemoteMonitors
# and TestPrivilegedTapCopiesATCPTransferAndPingsByteForByte (test/e2e)
# assert exactly which copies arrive (scripts/lib.sh).
ONEHOP=${1:-bin/onehop}
TOPO=${2:-examples/tap.yaml}
LAB=tap
source "$(dirname "$0")/lib.sh"

trap 'stop_bg; lab_down_quietly' EXIT
lab_up "$TOPO" "the TAP lab"

WEB1=$(iface web1 eth0 addr); WEB2=$(iface web2 eth0 addr); WEB3=$(iface web3 eth0 addr); MON1=$(iface mon1 eth0 addr)

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
BG+=("$TCPDUMP")
for _ in $(seq 100); do
  grep -q 'listening on' "$STATE/demo-tcpdump.err" 2>/dev/null && break
  sleep 0.1
done
grep -q 'listening on' "$STATE/demo-tcpdump.err" || failed "tcpdump on mon1 did not start: $(cat "$STATE/demo-tcpdump.err")"

say "web1 ($WEB1, h1) pings web2 ($WEB2, h2) 5 times, and web3 ($WEB3, h1) 3 times"
# pingsum FROM TO N: N pings, and ping's summary.
pingsum() {
  printf '$ onehop lab exec %s -- ping -c %s %s\n' "$1" "$3" "$2"
  on "$1" ping -c "$3" -i 0.2 -W 1 "$2" | grep -o '[0-9]* packets transmitted.*loss' | sed 's/^/   /'
}
pingsum web1 "$WEB2" 5
pingsum web1 "$WEB3" 3

say "web1 sends to web2's iperf3 for 2 s (TCP port 5201, 200 Mbit/s)"
on web2 iperf3 -s -1 -D
wait_listening web2 5201
printf '$ onehop lab exec web1 -- iperf3 -c %s -t 2 -b 200M\n' "$WEB2"
on web1 iperf3 -c "$WEB2" -t 2 -b 200M | grep -E 'sender|receiver' | sed 's/^/   /'

# Let the last copies land, then stop the capture (tcpdump writes -U: each
# packet as it comes).
for _ in $(seq 20); do
  [ -s "$PCAP" ] && break
  sleep 0.1
done
sleep 0.5
kill "$TCPDUMP" 2>/dev/null || true
wait "$TCPDUMP" 2>/dev/null || true
BG=()
ended=$(date +%H:%M:%S)

say "What mon1 received"
printf '$ tcpdump -nr %s icmp   # the ping copies\n' "$PCAP"
tcpdump -nr "$PCAP" icmp 2>/dev/null | sed 's/^/   /'
note "web1's 5 echo requests to web2, each once, as web2 received them; no replies: the policy is one way"
# count FILTER: how many captured packets FILTER matches.
count() { tcpdump -nr "$PCAP" "$1" 2>/dev/null | wc -l; }
printf '$ tcpdump -nr %s tcp | head -3   # the iperf3 copies\n' "$PCAP"
# (head closes the pipe early: tcpdump's SIGPIPE is no failure here)
tcpdump -nr "$PCAP" tcp 2>/dev/null | head -3 | sed 's/^/   /' || true
tcp_to=$(count "tcp and src host $WEB1 and dst host $WEB2 and dst port 5201")
note "$tcp_to TCP packets web1 -> web2:5201 (GSO superpackets, as web1's vif sent them),"
note "$(count "tcp and src host $WEB2") of web2's answers, $(count "host $WEB3") of web1 <-> web3: no policy names them"

say "Per-policy counters: copies made at h1 (the sender's edge), delivered at h2 (the monitor's)"
# Agents publish their status (and counters) at every reconcile, at least
# every 2 s: wait until both have published since the traffic ended.
for _ in $(seq 100); do
  st=$("$ONEHOP" stats --api "$API")
  awk -v end="$ended" '/^[^ ].* applied .* at / { n++; if ($NF > end) fresh++ } END { exit !(n == 2 && fresh == 2) }' <<<"$st" && break
  sleep 0.1
done
printf '$ onehop stats | grep -E "^[^ ]|tap "\n'
"$ONEHOP" stats --api "$API" | grep -E '^[^ ]|  tap ' | sed 's/^/   /'
printf '   (web-ping: the 5 pings and the probe pings that showed the policies had arrived; web-iperf: mon1 captured %s)\n' "$tcp_to"

say "All shown in $(elapsed) s; tearing the lab down"
rm -f "$PCAP" "$STATE/demo-tcpdump.err"
printf '$ onehop lab down --lab %s\n' "$LAB"
"$ONEHOP" lab down --lab "$LAB"
trap - EXIT
