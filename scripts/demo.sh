#!/usr/bin/env bash
# The quick-start demo: builds the lab, shows one-hop traffic between VMs on
# one host and across hosts, shows a spoofed packet being dropped and counted,
# and leaves the lab up to explore.
set -euo pipefail
ONEHOP=${1:-bin/onehop}
TOPO=${2:-examples/quickstart.yaml}
LAB=quickstart

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() {
  if [ "$1" = on ]; then printf '$ onehop lab exec %s -- %s\n' "$2" "${*:3}"; else printf '$ %s\n' "$*"; fi
  "$@"
}
on() { local node=$1; shift; "$ONEHOP" lab exec --lab "$LAB" "$node" -- "$@"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "demo: needs root (it creates network namespaces and loads eBPF); try: sudo make demo" >&2
  exit 1
fi

if "$ONEHOP" lab status --lab "$LAB" >/dev/null 2>&1; then
  say "Lab $LAB is already up; reusing it (make demo-down removes it)"
else
  say "Building the quick-start lab from $TOPO"
  run "$ONEHOP" lab up "$TOPO"
fi

say "What is where: hosts h1, h2 on one L2 fabric; VMs web1, web3 on h1 and web2 on h2"
run "$ONEHOP" lab status --lab "$LAB"

ip_of() { "$ONEHOP" lab status --lab "$LAB" -o json | python3 -c "import json,sys; print([n for n in json.load(sys.stdin)['nodes'] if n['name']=='$1'][0]['vm']['ip'])"; }
WEB2=$(ip_of web2); WEB3=$(ip_of web3)

say "Ping between VMs on the same host (web1 -> web3, $WEB3): the vif program hands the packet straight to web3"
run on web1 ping -c 3 -i 0.2 "$WEB3"
say "Ping across hosts (web1 -> web2, $WEB2): host MAC to host MAC over the fabric, no encapsulation"
run on web1 ping -c 3 -i 0.2 "$WEB2"

say "TCP across hosts with iperf3 (2 s)"
on web2 iperf3 -s -1 -D
sleep 0.5
run on web1 iperf3 -c "$WEB2" -t 2 -C cubic

say "TCP between VMs on one host with iperf3 (2 s)"
on web3 iperf3 -s -1 -D
sleep 0.5
run on web1 iperf3 -c "$WEB3" -t 2 -C cubic

say "Anti-spoofing: web1 pings web2 from an address that is not its own; nothing arrives"
on web1 ip neigh replace "$WEB2" lladdr "$(on web2 cat /sys/class/net/eth0/address)" dev eth0 nud permanent
on web1 ip addr add 10.1.1.77/32 dev eth0
printf '$ onehop lab exec web1 -- ping -c 2 -I 10.1.1.77 %s\n' "$WEB2"
on web1 ping -c 2 -i 0.2 -W 1 -I 10.1.1.77 "$WEB2" || true
on web1 ip addr del 10.1.1.77/32 dev eth0
on web1 ip neigh del "$WEB2" dev eth0 || true

say "h1's agent metrics (non-zero counters): what was forwarded, and each drop by reason"
on h1 curl -s localhost:9100/metrics | grep -E '^onehop_(dropped|forwarded)' | grep -v ' 0$'
say "The agent also logged why it dropped those packets:"
grep 'dropped packet' "/run/onehop/$LAB/agent-h1.log" | tail -2

cat <<EOT

The lab is still up. Explore it:
  $ONEHOP lab status                            nodes, namespaces, MACs, IPs, daemons
  $ONEHOP lab exec web1 -- ping 10.1.1.3        any command inside any node
  $ONEHOP lab exec fabric -- tcpdump -eni br0   watch the fabric: only host MACs, plain IPv4
  $ONEHOP lab exec h1 -- curl -s localhost:9100/metrics
  $ONEHOP lab restart h1                        restart an agent: traffic keeps flowing
  less /run/onehop/$LAB/agent-h1.log            agent log (reconciles, drops with reasons)
  $ONEHOP lab down                              remove everything (or: make demo-down)
EOT
