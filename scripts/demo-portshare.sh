#!/usr/bin/env bash
# The port-space demo: builds examples/portshare.yaml (h1 with slivers s1 and
# s2, h2 with s3, and inet, a plain machine on the fabric), shows that s1 and
# s2 carry h1's own address and MAC, that inet reaches s1's server on port
# 10022 and s2's on 10122 of that one address, that both slivers ping inet
# at once and each gets its own replies, and that a sliver cannot bind a
# port outside its lease; then tears the lab down.
#
# Anything that must be refused and is not stops the demo with "LEAK"; a
# step that fails stops it with "FAILED". The e2e test named at each step
# asserts what the demo only shows (scripts/lib.sh).
ONEHOP=${1:-bin/onehop}
TOPO=${2:-examples/portshare.yaml}
LAB=portshare
source "$(dirname "$0")/lib.sh"

trap 'stop_bg; lab_down_quietly' EXIT
lab_up "$TOPO" "the port-space lab"

H1=$(iface h1 uplink0 addr); H1MAC=$(iface h1 uplink0 mac)
H2=$(iface h2 uplink0 addr); INET=$(iface inet eth0 addr)

# TestPrivilegedExternalReachesEachSliverOnTheSharedAddressByPort asserts
# the slivers' addresses and MACs.
say "One public address, three tenants: s1 and s2 carry h1's own address and MAC ($H1, $H1MAC)"
show "$ONEHOP" lab status --lab "$LAB"
note "no NAT, no private address: what s1 and s2 see as their address is what inet talks to"

# serve SLIVER PORT: an HTTP server in the sliver (in its cgroup, by lab
# exec) answering GET /who with the sliver's name; ends by itself after 120 s.
serve() {
  local dir=$STATE/demo-www-$1
  mkdir -p "$dir"; echo "$1" >"$dir/who"
  printf '$ onehop lab exec %s -- python3 -m http.server %s --directory %s &\n' "$1" "$2" "$dir"
  "$ONEHOP" lab exec --lab "$LAB" "$1" -- timeout 120 python3 -m http.server "$2" --bind 0.0.0.0 --directory "$dir" >/dev/null 2>&1 &
  BG+=("$!")
  wait_listening "$1" "$2"
}
# fetch FROM IP PORT: GET /who, which answers with the server's sliver.
fetch() {
  local got
  printf '$ onehop lab exec %s -- curl -s http://%s:%s/who\n' "$1" "$2" "$3"
  got=$(on "$1" curl -s --max-time 3 "http://$2:$3/who") || failed "$1 cannot reach $2:$3"
  note "answered by $got"
}

# TestPrivilegedExternalReachesEachSliverOnTheSharedAddressByPort asserts
# which sliver answers.
say "Inbound: the destination port picks the sliver (s1 leases 10000-10099, s2 10100-10199)"
serve s1 10022
serve s2 10122
serve s3 10022
fetch inet "$H1" 10022
fetch inet "$H1" 10122
say "The same port on another host's address is another sliver's (s3 on h2 leases 10000-10099 too)"
fetch inet "$H2" 10022

# TestPrivilegedTwoSliversPingingOneRemoteEachGetOnlyTheirOwnReplies
# asserts that each gets exactly its own replies.
say "Outbound: s1 and s2 ping inet ($INET) at the same time; each gets its own replies"
printf '$ onehop lab exec s1 -- ping -c 5 %s & onehop lab exec s2 -- ping -c 5 %s\n' "$INET" "$INET"
on s1 ping -c 5 -i 0.2 -W 1 "$INET" >"$STATE/demo-ping-s1.out" 2>&1 & p1=$!
on s2 ping -c 5 -i 0.2 -W 1 "$INET" >"$STATE/demo-ping-s2.out" 2>&1 & p2=$!
wait "$p1" || failed "s1 cannot ping inet: $(cat "$STATE/demo-ping-s1.out")"
wait "$p2" || failed "s2 cannot ping inet: $(cat "$STATE/demo-ping-s2.out")"
for s in s1 s2; do
  note "$s: $(grep -o '[0-9]* packets transmitted.*' "$STATE/demo-ping-$s.out")"
done
note "an echo reply goes only to the sliver whose echo id it is (ping would count duplicates)"

# TestPrivilegedBindOutsideTheLeaseFailsWithEPERM asserts the error.
say "Confinement: s1 may bind only its own ports; 10150 is s2's"
bind() {
  on "$1" python3 -c '
import socket, sys
s = socket.socket()
try:
    s.bind(("", int(sys.argv[1])))
    print("bound")
except OSError as e:
    print(e.strerror); sys.exit(1)' "$2"
}
printf '$ onehop lab exec s1 -- python3 -c "socket.socket().bind((\"\", 10050))"\n'
out=$(bind s1 10050) || failed "s1 cannot bind its own port 10050: $out"
ok "$out"
printf '$ onehop lab exec s1 -- python3 -c "socket.socket().bind((\"\", 10150))"\n'
if out=$(bind s1 10150); then leak "s1 bound s2's port 10150"; fi
blocked "bind(10150): $out (EPERM, from the host: s1's cgroup)"

say "All shown in $(elapsed) s; tearing the lab down"
stop_bg
rm -rf "$STATE"/demo-www-* "$STATE"/demo-ping-*.out
show "$ONEHOP" lab down --lab "$LAB"
trap - EXIT
