#!/usr/bin/env bash
# The quick-start demo: builds the three-host lab, shows each behaviour of the
# virtual router working and being blocked (one-hop routing, the ARP engine,
# visibility rules, farm isolation, scoped broadcast, per-VM firewalls,
# anti-spoofing, DHCP on the host, egress to inet, a published port, a floating
# address kept across a live move), with the drop counters that say
# why, and leaves the lab up to explore.
#
# Anything that must be blocked and gets through stops the demo with
# "LEAK"; a step that fails stops it with "FAILED". The e2e test named at
# each step asserts what the demo only shows (scripts/lib.sh).
ONEHOP=${1:-bin/onehop}
TOPO=${2:-examples/quickstart.yaml}
LAB=quickstart
source "$(dirname "$0")/lib.sh"

# pings FROM TO: must get replies; prints ping's summary line.
pings() {
  local out
  printf '$ onehop lab exec %s -- ping -c 3 %s\n' "$1" "$2"
  out=$(on "$1" ping -c 3 -i 0.2 -W 1 "$2") || failed "$1 cannot ping $2: $out"
  grep -E 'bytes from|received' <<<"$out" | sed -n '1p;$p' | sed 's/^/   /'
}
# no_ping FROM TO: must get no reply.
no_ping() {
  local out
  printf '$ onehop lab exec %s -- ping -c 2 %s\n' "$1" "$2"
  if out=$(on "$1" ping -c 2 -i 0.2 -W 1 "$2" 2>&1); then leak "$1 got ping replies from $2: $out"; fi
  blocked "$(grep -o '[0-9]* packets transmitted.*loss' <<<"$out")"
}
# no_tcp FROM IP PORT: a TCP connection must time out. A listener is there,
# so "refused" would mean the SYN reached the VM and its RST came back.
no_tcp() {
  printf '$ onehop lab exec %s -- bash -c "exec 3<>/dev/tcp/%s/%s"   # 2 s timeout\n' "$1" "$2" "$3"
  local rc=0
  on "$1" timeout 2 bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null || rc=$?
  case $rc in
    124) blocked "no answer to the SYN: the connection timed out" ;;
    0) leak "$1 connected to $2:$3" ;;
    *) leak "$1 -> $2:$3 was refused: the SYN reached the VM" ;;
  esac
}
# tcp FROM IP PORT: a TCP connection must open.
tcp() {
  printf '$ onehop lab exec %s -- bash -c "exec 3<>/dev/tcp/%s/%s"\n' "$1" "$2" "$3"
  on "$1" timeout 2 bash -c "exec 3<>/dev/tcp/$2/$3" || failed "$1 cannot connect to $2:$3"
  ok "connected"
}
# arp_event HOST EVENT: the host's ARP engine counter for EVENT.
arp_event() { metric "$1" onehop_arp_engine_events_total "event=\"$2\""; }
trap stop_bg EXIT

lab_up "$TOPO" "the quick-start lab"

say "What is where: hosts h1 h2 h3 on one L2 fabric; farm blue (subnets web, db), farm red (web)"
op get vms
say "Who may talk to whom: web may open tcp/5432 and ping to db; nothing else crosses a subnet or a farm"
op get rules

WEB1=$(iface web1 eth0 addr); WEB2=$(iface web2 eth0 addr); WEB3=$(iface web3 eth0 addr); DB1=$(iface db1 eth0 addr)
GW_WEB=${WEB1%.*}.1

say "Same host (web1 -> web3, $WEB3): the vif program hands the packet straight to web3"
pings web1 "$WEB3"
say "Across hosts (web1 on h1 -> web2 on h2, $WEB2): host MAC to host MAC over the fabric, no encapsulation"
mapped=$(metric h1 onehop_mapping_table_entries)
pings web1 "$WEB2"

say "The ARP engine: h1 had $mapped remote VMs mapped before that ping; nobody pushed it where web2 lives"
printf '   web1 ARPed for web2; h1 had no mapping, so it asked the Ethernet multicast address of blue/web\n'
printf '   (03:00:0a:01:01:00) on the fabric; only h2, which holds web2, answered; h1 learned web2 -> h2.\n'
# TestPrivilegedARPEngineLearnsOnDemand asserts these counters rose and
# that web1's neighbour entry is web2's MAC.
note "counters: h1 asked the fabric $(fwds h1 arp_to_fabric) time(s), h2 answered $(fwds h2 arp_answered), h1 learned $(fwds h1 arp_learned)"
vin web1 ip neigh show "$WEB2"
note "web2's MAC is $(iface web2 eth0 mac): its virtual MAC (02:00 + its address) reached web1 by ARP;"
note "no virtual MAC crossed the fabric in a frame header"

say "TCP across hosts with iperf3 (2 s)"
on web2 iperf3 -s -1 -D
sleep 0.3
printf '$ onehop lab exec web1 -- iperf3 -c %s -t 2\n' "$WEB2"
on web1 iperf3 -c "$WEB2" -t 2 -C cubic | grep -E 'sender|receiver'
say "TCP between VMs on one host with iperf3 (2 s)"
on web3 iperf3 -s -1 -D
sleep 0.3
printf '$ onehop lab exec web1 -- iperf3 -c %s -t 2\n' "$WEB3"
on web1 iperf3 -c "$WEB3" -t 2 -C cubic | grep -E 'sender|receiver'

say "One hop to another subnet (web1 -> db1 on h3, $DB1): allowed by the icmp rule; TTL 64 comes back as 63"
pings web1 "$DB1"
# TestPrivilegedARPEngineLearnsOnDemand asserts the held and released counts.
printf '   web1 only ARPed for its gateway: the first packet for db1 reached h1 before h1 knew db1'"'"'s host.\n'
printf '   h1'"'"'s agent held it while its ARP engine asked (held %s, released %s): the first ping was not lost.\n' \
  "$(arp_event h1 held)" "$(arp_event h1 released)"
# TestPrivilegedInterSubnetRuleOpensOnlyWhatItNamesInOneHop asserts the hops.
vin web1 traceroute -I -n -q 1 -w 1 -m 4 "$DB1"
note "one hop, web's virtual gateway $GW_WEB, then db1: every host is the router"

# TestPrivilegedInterSubnetRuleOpensOnlyWhatItNamesInOneHop and
# TestLeakUnicastAcrossFarmsAndSubnetsOverTCPUDPAndICMP assert what follows,
# and the not_visible counts.
say "web1 -> db1 tcp/5432: the rule allows it (a listener on 5432 and one on 22 in db1)"
listen db1 5432
listen db1 22
tcp web1 "$DB1" 5432
say "web1 -> db1 tcp/22: no rule names it"
n=$(drops h1 not_visible)
no_tcp web1 "$DB1" 22
counted "$n" h1 not_visible
say "web1 -> db1 udp/5432: the rule says tcp; a UDP listener in db1 hears nothing"
"$ONEHOP" lab exec --lab "$LAB" db1 -- timeout 3 python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("", 5432)); s.settimeout(2.5); print(s.recv(100).decode())' >"$STATE/demo-udp.out" 2>&1 &
udp=$!
sleep 0.3
n=$(drops h1 not_visible)
printf '$ onehop lab exec web1 -- bash -c "echo hello >/dev/udp/%s/5432"   # three times\n' "$DB1"
for _ in 1 2 3; do on web1 bash -c "echo hello >/dev/udp/$DB1/5432"; sleep 0.1; done
if wait "$udp"; then leak "db1 received UDP from web1: $(cat "$STATE/demo-udp.out")"; fi
blocked "db1's UDP listener timed out with nothing received"
counted "$n" h1 not_visible
rm -f "$STATE/demo-udp.out"

# TestLeakARPNeverCrossesSubnetsOrFarms asserts the arp_other_subnet count.
say "ARP for another subnet is dropped (the farm has no proxy ARP): web1 is told db1 is on its link"
on web1 ip route add "$DB1" dev eth0
n=$(drops h1 arp_other_subnet)
no_ping web1 "$DB1"
on web1 ip route del "$DB1" dev eth0
counted "$n" h1 arp_other_subnet

say "db1 -> web1: rules are one-way, so db1 cannot open anything towards web (its replies above passed)"
listen web1 8080
n=$(drops h3 not_visible)
no_ping db1 "$WEB1"
no_tcp db1 "$WEB1" 8080
counted "$n" h3 not_visible
stop_bg

# TestPrivilegedInterSubnetAndInterFarmTrafficDroppedWithoutRules asserts this.
say "Farm red is not peered with blue: red1 (on h1, like web1 and web3) reaches red2 on h3, and no blue VM"
pings red1 "$(iface red2 eth0 addr)"
n=$(drops h1 not_visible)
no_ping red1 "$WEB3"
no_ping red1 "$WEB2"
counted "$n" h1 not_visible
n=$(drops h3 not_visible)
no_ping red2 "$DB1"
counted "$n" h3 not_visible

# TestPrivilegedBroadcastAndMulticastReachTheirScopeOnAnyHostAndNoOneElse
# asserts who hears it.
say "Scoped broadcast: web1's subnet broadcast reaches web2 (h2) and web3 (h1); not db1 (other subnet), not red1 (other farm)"
for vm in web2 web3 db1 red1; do
  "$ONEHOP" lab exec --lab "$LAB" "$vm" -- timeout 3 python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("", 9999)); s.settimeout(2); print(s.recv(100).decode())' >"$STATE/demo-bcast-$vm.out" 2>&1 &
  eval "bcast_$vm=\$!"
done
sleep 0.5
BCAST=${WEB1%.*}.255
printf '$ onehop lab exec web1 -- python3 -c "...sendto(b\"hello subnet\", (\"%s\", 9999))"   # SO_BROADCAST\n' "$BCAST"
on web1 python3 -c 'import socket,sys; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1); s.sendto(b"hello subnet", (sys.argv[1], 9999))' "$BCAST"
for vm in web2 web3; do
  eval "pid=\$bcast_$vm"
  wait "$pid" || failed "$vm did not receive web1's subnet broadcast"
  ok "$vm received: $(cat "$STATE/demo-bcast-$vm.out")"
done
for vm in db1 red1; do
  eval "pid=\$bcast_$vm"
  if wait "$pid"; then leak "$vm received web1's subnet broadcast: $(cat "$STATE/demo-bcast-$vm.out")"; fi
  blocked "$vm heard nothing"
done
rm -f "$STATE"/demo-bcast-*.out

# TestPrivilegedVMFirewallAdmitsOnlyItsRulesAndReplies asserts the firewall_in count.
say "A per-VM firewall, set by the tenant, enforced on web2's host h2: refuse pings from web3"
op firewall add blue/web/web2 --in --proto icmp --from "$WEB3/32" --deny
op get vms | grep -E '^VM|web2'
# The rule goes API -> etcd -> controller -> h2's agent -> BPF map.
for _ in $(seq 50); do on web3 ping -c 1 -W 0.2 "$WEB2" >/dev/null 2>&1 || break; sleep 0.1; done
n=$(drops h2 firewall_in)
no_ping web3 "$WEB2"
counted "$n" h2 firewall_in
printf '   web1 is not named by the rule:\n'
pings web1 "$WEB2"

# TestPrivilegedSpoofedSourceIPAndMACNeverArrive asserts the spoofed_ip count.
say "Anti-spoofing: web1 pings web2 from an address that is not its own; nothing arrives"
on web1 ip neigh replace "$WEB2" lladdr "$(iface web2 eth0 mac)" dev eth0 nud permanent
on web1 ip addr add 10.1.1.77/32 dev eth0
n=$(drops h1 spoofed_ip)
printf '$ onehop lab exec web1 -- ping -c 2 -I 10.1.1.77 %s\n' "$WEB2"
if out=$(on web1 ping -c 2 -i 0.2 -W 1 -I 10.1.1.77 "$WEB2" 2>&1); then leak "spoofed pings got replies: $out"; fi
on web1 ip addr del 10.1.1.77/32 dev eth0
on web1 ip neigh del "$WEB2" dev eth0 || true
blocked "$(grep -o '[0-9]* packets transmitted.*loss' <<<"$out")"
counted "$n" h1 spoofed_ip

# TestPrivilegedDHCPClientGetsItsAddressFromItsOwnHost asserts the lease.
say "DHCP is answered on the VM's own host: web2 asks, h2's agent answers with web2's address"
cat >"$STATE/demo-udhcpc.sh" <<'EOS'
#!/bin/sh
# Print the lease only: the demo leaves web2's interface as it is.
[ "$1" = bound ] && echo "   lease: ip=$ip subnet=$subnet router=$router dns=${dns:-none} lease=${lease}s server=$serverid"
exit 0
EOS
chmod +x "$STATE/demo-udhcpc.sh"
printf '$ onehop lab exec web2 -- udhcpc -i eth0 -n -q -f\n'
lease=$(on web2 udhcpc -i eth0 -n -q -f -t 3 -T 1 -s "$STATE/demo-udhcpc.sh" 2>/dev/null) || failed "web2 got no DHCP lease"
rm -f "$STATE/demo-udhcpc.sh"
grep lease: <<<"$lease"
note "web2's own address ($WEB2), its gateway, a 7-day lease; the request never left h2"

# TestPrivilegedVMsOnTwoHostsReachInetThroughTheirOwnHostsSlices asserts this.
INET=$(iface inet eth0 addr)
say "Egress: blue's VMs reach inet ($INET), outside the tenant space, through their own host's address"
"$ONEHOP" lab exec --lab "$LAB" inet -- timeout 60 python3 -m http.server 8080 --bind "$INET" >/dev/null 2>&1 &
BG+=("$!")
wait_listening inet 8080
op get vms | grep -E '^VM|web1|red1'
printf '$ onehop lab exec web1 -- curl -s http://%s:8080/\n' "$INET"
on web1 curl -sf -m 5 "http://$INET:8080/" | grep -m1 -o '<title>.*</title>' | sed 's/^/   /' || failed "web1 cannot fetch from inet"
note "inet saw h1's address ($(iface h1 uplink0 addr)) with a port of web1's slice; the reply came back by that port, in one array lookup"
printf '$ onehop lab exec red1 -- curl -s -m 2 http://%s:8080/\n' "$INET"
n=$(drops h1 no_route)
if out=$(on red1 curl -sf -m 2 "http://$INET:8080/" 2>&1); then leak "red1 (no egress) fetched from inet: $out"; fi
blocked "red's farm has no egress: nothing outside"
counted "$n" h1 no_route
stop_bg

# TestPrivilegedAPublishedPortIsReachedFromInetWithItsOwnAddress asserts this.
H2=$(iface h2 uplink0 addr)
say "A published port: inet reaches web2's port 8000 on h2's address ($H2), port 8080"
op vm publish blue/web/web2 --proto tcp --port 8000 --public-port 8080
# A plain TCPServer: http.server's own looks its address up in DNS first,
# and web2 (with egress) waits for a DNS server that is not there.
"$ONEHOP" lab exec --lab "$LAB" web2 -- timeout 60 python3 -c 'import http.server, socketserver, sys
socketserver.TCPServer((sys.argv[1], 8000), http.server.SimpleHTTPRequestHandler).serve_forever()' "$WEB2" >"$STATE/demo-web2.log" 2>&1 &
BG+=("$!")
wait_listening web2 8000
printf '$ onehop lab exec inet -- curl -s http://%s:8080/\n' "$H2"
on inet curl -sf -m 5 "http://$H2:8080/" | grep -m1 -o '<title>.*</title>' | sed 's/^/   /' || failed "inet cannot reach web2's published port"
grep -q "^$INET " "$STATE/demo-web2.log" || failed "web2's server did not see inet's own address: $(cat "$STATE/demo-web2.log")"
note "web2's server log: $(grep -m1 "^$INET " "$STATE/demo-web2.log" | cut -c1-60)"
note "web2 saw inet's own address: only the destination was rewritten on the way in"
printf '$ onehop lab exec inet -- curl -s -m 2 http://%s:8000/\n' "$H2"
if out=$(on inet curl -sf -m 2 "http://$H2:8000/" 2>&1); then leak "inet reached web2's unpublished port through h2: $out"; fi
blocked "web2's own port 8000 is not published on h2's address"
op vm unpublish blue/web/web2 --proto tcp --port 8000
stop_bg
rm -f "$STATE/demo-web2.log"

# TestPrivilegedFloatingAddressReachesItsVMAndSurvivesALiveMove asserts this.
FLOAT=192.168.100.200
say "A floating address: the operator's $FLOAT goes to web3, reached on it whole wherever web3 lives"
op floating create "$FLOAT"
op floating attach "$FLOAT" blue/web/web3
pings inet "$FLOAT"
say "web3 moves (like a live migration) from h1 to h3 while inet streams to it on $FLOAT"
on web3 iperf3 -s -1 -D
sleep 0.3
printf '$ onehop lab exec inet -- iperf3 -c %s -t 5 -i 1 &\n' "$FLOAT"
"$ONEHOP" lab exec --lab "$LAB" inet -- iperf3 -c "$FLOAT" -t 5 -i 1 -C cubic >"$STATE/demo-float.out" 2>&1 &
stream=$!
sleep 1.5
printf '$ onehop lab move web3 --to h3\n'
"$ONEHOP" lab move web3 --to h3 --lab "$LAB" 2>&1 | sed 's/^/   /'
wait "$stream" || failed "the stream through $FLOAT broke: $(cat "$STATE/demo-float.out")"
grep -E '^\[ *[0-9]+\] +[0-9.]+-[0-9.]+ +sec' "$STATE/demo-float.out" | grep -v -E 'sender|receiver' | sed 's/^/   /'
last=$(grep -E 'bits/sec' "$STATE/demo-float.out" | grep -v -E 'sender|receiver' | tail -1)
if [ -z "$last" ] || grep -qE ' 0\.00 [KMG]?bits/sec' <<<"$last"; then failed "no data after the move: $last"; fi
note "the same TCP connection kept going: h3 sent a gratuitous ARP for $FLOAT, and inet followed it"
rm -f "$STATE/demo-float.out"

# TestPrivilegedMovedVMKeepsItsAddressAndItsTCPConnection asserts this.
say "After its move web3 keeps its tenant address and MAC too"
pings web1 "$WEB3"
op get vms | grep -E '^VM|web3'
note "web3 answers from h3; h3 announced it on the fabric and every host that was sending to it followed"

say "Every host's datapath: mapping table, vifs, what it forwarded and dropped, by reason"
# Agents publish their counters every few seconds; wait for the last drops.
for _ in $(seq 100); do
  st=$("$ONEHOP" stats --api "$STATE/api.sock")
  grep -q spoofed_ip <<<"$st" && grep -q firewall_in <<<"$st" && break
  sleep 0.1
done
op stats
say "Each agent also logged why it dropped (last lines of h1's log):"
grep 'dropped packet' "$STATE/agent-h1.log" | tail -3

say "All shown in $(elapsed) s"
printf '\nThe lab is still up. Explore it:\n'
hint() { printf '  %-58s %s\n' "$1" "$2"; }
hint "$ONEHOP get vms" "every VM: host, address, MAC, firewall, egress, floating"
hint "$ONEHOP lab exec web1 -- ping $DB1" "any command inside any node"
hint "$ONEHOP lab exec web1 -- traceroute -I $DB1" "one hop: the gateway $GW_WEB"
hint "$ONEHOP lab exec fabric -- tcpdump -eni br0" "the fabric: only host MACs, plain IPv4"
hint "$ONEHOP allow blue/db blue/web --proto tcp --port 8080" "open one more way"
hint "$ONEHOP stats --node h1" "drops by reason (published every few seconds)"
hint "$ONEHOP lab exec h1 -- curl -s localhost:9100/metrics" "the same, live, for Prometheus"
hint "$ONEHOP lab restart h1" "restart an agent: traffic keeps flowing"
hint "less $STATE/agent-h1.log" "agent log: reconciles, drops with reasons"
hint "make demo-down" "remove everything ($ONEHOP lab down --lab $LAB)"
