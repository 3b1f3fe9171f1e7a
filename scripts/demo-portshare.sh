#!/usr/bin/env bash
# The port-space demo: builds examples/portshare.yaml (h1 with slivers s1 and
# s2, h2 with s3, and inet, a plain machine on the fabric), shows that s1 and
# s2 carry h1's own address and MAC, that inet reaches s1's server on port
# 10022 and s2's on 10122 of that one address, that both slivers ping inet
# at once and each gets its own replies, and that a sliver cannot bind a
# port outside its lease; then tears the lab down.
#
# Anything that must be refused and is not stops the demo with "LEAK";
# anything that must work and does not stops it with "FAILED".
set -euo pipefail
ONEHOP=${1:-bin/onehop}
TOPO=${2:-examples/portshare.yaml}
LAB=portshare
STATE=/run/onehop/$LAB

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
ok() { printf '   \033[32mok:\033[0m %s\n' "$*"; }
blocked() { printf '   \033[32mrefused, as expected:\033[0m %s\n' "$*"; }
leak() { printf '\n\033[31mLEAK: %s\033[0m\n' "$*" >&2; exit 1; }
failed() { printf '\n\033[31mFAILED: %s\033[0m\n' "$*" >&2; exit 1; }
on() { local node=$1; shift; "$ONEHOP" lab exec --lab "$LAB" "$node" -- "$@"; }
von() { printf '$ onehop lab exec %s -- %s\n' "$1" "${*:2}"; on "$@"; }
show() { printf '$ %s\n' "$*"; "$@"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "demo-portshare: needs root (it creates network namespaces and loads eBPF); try: sudo make demo-portshare" >&2
  exit 1
fi
SERVERS=()
cleanup() {
  for p in "${SERVERS[@]}"; do kill "$p" 2>/dev/null || true; done
  "$ONEHOP" lab down --lab "$LAB" >/dev/null 2>&1 || true
}
trap cleanup EXIT
started=$(date +%s)

if "$ONEHOP" lab status --lab "$LAB" >/dev/null 2>&1; then
  say "Lab $LAB is already up; rebuilding it so the demo starts from the topology file"
  "$ONEHOP" lab down --lab "$LAB" >/dev/null
fi
say "Building the port-space lab from $TOPO"
show "$ONEHOP" lab up "$TOPO"

# field NODE IFACE mac|addr: from lab status, read inside the node's namespace.
field() {
  "$ONEHOP" lab status --lab "$LAB" -o json | python3 -c '
import json, sys
node, ifc, what = sys.argv[1:4]
n = [n for n in json.load(sys.stdin)["nodes"] if n["name"] == node][0]
byname = {i["name"]: i for i in n["interfaces"]}
i = byname[ifc]
# A bridge lab keeps a host'"'"'s address on its bridge br0 (with the uplink'"'"'s MAC).
addrs = i["addrs"] or byname.get("br0", {}).get("addrs", [])
print(i["mac"] if what == "mac" else addrs[0].split("/")[0])' "$1" "$2" "$3"
}
H1=$(field h1 uplink0 addr); H1MAC=$(field h1 uplink0 mac)
H2=$(field h2 uplink0 addr); INET=$(field inet eth0 addr)

say "One public address, three tenants: s1 and s2 carry h1's own address and MAC ($H1, $H1MAC)"
show "$ONEHOP" lab status --lab "$LAB"
for s in s1 s2; do
  [ "$(field "$s" eth0 addr)" = "$H1" ] || failed "$s's eth0 does not carry h1's address $H1"
  [ "$(field "$s" eth0 mac)" = "$H1MAC" ] || failed "$s's eth0 does not carry h1's MAC $H1MAC"
done
[ "$(field s3 eth0 addr)" = "$H2" ] || failed "s3's eth0 does not carry h2's address $H2"
ok "no NAT, no private address: what s1 and s2 see as their address is what inet talks to"

# serve SLIVER PORT: an HTTP server in the sliver (in its cgroup, by lab
# exec) answering GET /who with the sliver's name; ends by itself after 120 s.
serve() {
  local dir=$STATE/demo-www-$1
  mkdir -p "$dir"; echo "$1" >"$dir/who"
  printf '$ onehop lab exec %s -- python3 -m http.server %s --directory %s &\n' "$1" "$2" "$dir"
  "$ONEHOP" lab exec --lab "$LAB" "$1" -- timeout 120 python3 -m http.server "$2" --bind 0.0.0.0 --directory "$dir" >/dev/null 2>&1 &
  SERVERS+=("$!")
  for _ in $(seq 50); do
    on "$1" ss -Hltn "sport = :$2" | grep -q . && return 0
    sleep 0.1
  done
  failed "no server listening in $1 on port $2"
}
# fetch FROM IP PORT WANT: GET /who must answer WANT.
fetch() {
  local got
  printf '$ onehop lab exec %s -- curl -s http://%s:%s/who\n' "$1" "$2" "$3"
  got=$(on "$1" curl -s --max-time 3 "http://$2:$3/who") || failed "$1 cannot reach $2:$3"
  [ "$got" = "$4" ] || failed "$2:$3 answered '$got', want '$4'"
  ok "answered by $got"
}

say "Inbound: the destination port picks the sliver (s1 leases 10000-10099, s2 10100-10199)"
serve s1 10022
serve s2 10122
serve s3 10022
fetch inet "$H1" 10022 s1
fetch inet "$H1" 10122 s2
say "The same port on another host's address is another sliver's (s3 on h2 leases 10000-10099 too)"
fetch inet "$H2" 10022 s3

say "Outbound: s1 and s2 ping inet ($INET) at the same time; each gets its own replies"
printf '$ onehop lab exec s1 -- ping -c 5 %s & onehop lab exec s2 -- ping -c 5 %s\n' "$INET" "$INET"
on s1 ping -c 5 -i 0.2 -W 1 "$INET" >"$STATE/demo-ping-s1.out" 2>&1 & p1=$!
on s2 ping -c 5 -i 0.2 -W 1 "$INET" >"$STATE/demo-ping-s2.out" 2>&1 & p2=$!
wait "$p1" || failed "s1 cannot ping inet: $(cat "$STATE/demo-ping-s1.out")"
wait "$p2" || failed "s2 cannot ping inet: $(cat "$STATE/demo-ping-s2.out")"
for s in s1 s2; do
  grep -q 'DUP!' "$STATE/demo-ping-$s.out" && leak "$s got replies twice (another sliver's?)"
  printf '   %s: %s\n' "$s" "$(grep -o '[0-9]* packets transmitted.*loss' "$STATE/demo-ping-$s.out")"
done
ok "5 of 5 each, no duplicates: an echo reply goes only to the sliver whose echo id it is"

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
[ "$out" = "Operation not permitted" ] || failed "binding 10150 failed with '$out', want 'Operation not permitted'"
blocked "bind(10150): $out (EPERM, from the host: s1's cgroup)"

say "All shown in $(( $(date +%s) - started )) s; tearing the lab down"
for p in "${SERVERS[@]}"; do kill "$p" 2>/dev/null || true; done
SERVERS=()
rm -rf "$STATE"/demo-www-* "$STATE"/demo-ping-*.out
show "$ONEHOP" lab down --lab "$LAB"
trap - EXIT
