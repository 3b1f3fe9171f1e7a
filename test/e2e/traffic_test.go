package e2e

import (
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/testenv"
)

func TestPrivilegedPingAndTCPBetweenVMsOnOneHostAndAcrossHosts(t *testing.T) {
	testenv.RequireTool(t, "iperf3")
	l := upLab(t, quickstart)
	web2, web3 := l.ip("web2"), l.ip("web3")
	before := l.metrics("h1")

	if err := l.ping("web1", web3, 3); err != nil {
		t.Errorf("same host: %v", err)
	}
	if err := l.ping("web1", web2, 3); err != nil {
		t.Errorf("across hosts: %v", err)
	}
	for _, dst := range []struct{ vm, ip string }{{"web3", web3}, {"web2", web2}} {
		l.start(dst.vm, "iperf3", "-s", "-1")
		l.waitListening(dst.vm, "tcp", 5201)
		out := l.mustIn("web1", "iperf3", "-c", dst.ip, "-n", "20M", "-C", "cubic")
		if !strings.Contains(out, "receiver") {
			t.Errorf("TCP web1 -> %s did not complete:\n%s", dst.vm, out)
		}
	}

	after := l.metrics("h1")
	for _, path := range []string{"local", "to_fabric", "from_fabric", "arp_reply"} {
		if d := rise(before, after, forwards(path)); d <= 0 {
			t.Errorf("forwarded counter %s did not rise (%v -> %v): traffic bypassed the datapath?",
				path, before.at(forwards(path)), after.at(forwards(path)))
		}
	}
	for k, v := range after.m {
		if strings.HasPrefix(k, "onehop_dropped_packets_total") && v != before.m[k] {
			t.Errorf("legitimate traffic was dropped: %s %v -> %v", k, before.m[k], v)
		}
	}
}

func TestPrivilegedSpoofedSourceIPAndMACNeverArrive(t *testing.T) {
	l := upLab(t, quickstart)
	web1, web2 := l.ip("web1"), l.ip("web2")
	web2MAC := l.mac("web2", "eth0")
	// Pin web2's MAC in web1's neighbour table, so the spoofed frames below are
	// IPv4 (not ARP) and reach the anti-spoofing check as such.
	l.mustIn("web1", "ip", "neigh", "replace", web2, "lladdr", web2MAC, "dev", "eth0", "nud", "permanent")
	before := l.metrics("h1")
	w := l.watchVM("web2", "web1")
	proveLive(t, "start", w)

	// Legitimate pings first: the capture must see these too.
	if err := l.ping("web1", web2, 2); err != nil {
		t.Fatal(err)
	}
	// A source IP that is not web1's (another VM's address in the subnet).
	// The pings get no answer: their failure is the point.
	spoofIP := "10.1.1.77"
	l.mustIn("web1", "ip", "addr", "add", spoofIP+"/32", "dev", "eth0")
	if err := l.ping("web1", web2, 3, "-I", spoofIP); err == nil {
		t.Errorf("pings from the spoofed %s were answered", spoofIP)
	}
	l.mustIn("web1", "ip", "addr", "del", spoofIP+"/32", "dev", "eth0")
	// A source MAC that is not web1's.
	realMAC := l.mac("web1", "eth0")
	spoofMAC := "02:00:0a:01:01:63"
	l.mustIn("web1", "ip", "link", "set", "eth0", "address", spoofMAC)
	// Changing the MAC flushes the neighbour table, permanent entries too.
	l.mustIn("web1", "ip", "neigh", "replace", web2, "lladdr", web2MAC, "dev", "eth0", "nud", "permanent")
	if err := l.ping("web1", web2, 3); err == nil {
		t.Errorf("pings from the spoofed MAC %s were answered", spoofMAC)
	}
	l.mustIn("web1", "ip", "link", "set", "eth0", "address", realMAC)
	stopWatches(t, w)

	var legit int
	for _, f := range w.frames {
		if f.icmpType != "8" { // echo requests only
			continue
		}
		switch {
		case f.ipSrc == spoofIP:
			t.Errorf("packet with spoofed source IP reached web2: %s", f)
		case f.ethSrc == spoofMAC:
			t.Errorf("packet with spoofed source MAC reached web2: %s", f)
		case f.ipSrc == web1:
			legit++
		}
	}
	if legit != 2 {
		t.Errorf("capture at web2 saw %d of web1's 2 legitimate echo requests", legit)
	}
	after := l.metrics("h1")
	if d := rise(before, after, drops("spoofed_ip")); d != 3 {
		t.Errorf("spoofed_ip drops rose by %v, want 3", d)
	}
	if d := rise(before, after, drops("spoofed_mac")); d != 3 {
		t.Errorf("spoofed_mac drops rose by %v, want 3", d)
		for k, v := range after.m {
			if v != before.m[k] {
				t.Logf("%s: %v -> %v", k, before.m[k], v)
			}
		}
	}
}

func TestPrivilegedFabricCarriesOnlyHostMACsAndPlainIPv4(t *testing.T) {
	testenv.RequireTool(t, "iperf3")
	l := upLab(t, quickstart)
	allowed := map[string]string{
		l.mac("h1", "uplink0"):       "h1",
		l.mac("h2", "uplink0"):       "h2",
		l.mac("controller", "mgmt0"): "controller",
		"ff:ff:ff:ff:ff:ff":          "broadcast",
	}
	// The switch's own ports may speak for themselves (as a physical
	// switch's do); what must never appear is a VM's virtual MAC.
	switchMACs := map[string]bool{}
	for _, i := range l.node("fabric").Interfaces {
		switchMACs[i.MAC] = true
	}
	w := l.watchFabric("web1", "web2")
	proveLive(t, "start", w)
	if err := l.ping("web1", l.ip("web2"), 3); err != nil {
		t.Fatal(err)
	}
	l.start("web2", "iperf3", "-s", "-1")
	l.waitListening("web2", "tcp", 5201)
	l.mustIn("web1", "iperf3", "-c", l.ip("web2"), "-n", "5M", "-C", "cubic")
	stopWatches(t, w)

	tenant, questions, answers := 0, 0, 0
	subnetScope := "03:00:0a:01:01:00" // blue/web's Ethernet multicast address
	for _, f := range w.frames {
		if f.liveness() {
			continue // the capture's own proof, checked by stopWatches
		}
		if switchMACs[f.ethSrc] && !strings.HasPrefix(f.ipSrc, "10.") {
			continue // the switch's own control traffic (IGMP from its ports)
		}
		macs := []string{f.ethSrc, f.ethDst}
		if f.ethType == "0x0806" && strings.HasPrefix(f.arpTPA, "10.") {
			// The ARP engine: a question for a VM goes to its subnet's
			// multicast address, never to broadcast; the answer is unicast
			// between hosts.
			switch {
			case f.arpOp == "1" && f.ethDst == subnetScope:
				questions++
			case f.arpOp == "2" && f.ethDst != "ff:ff:ff:ff:ff:ff":
				answers++
			case f.arpOp == "2":
				// an announcement of a VM that arrived on a host
			default:
				t.Errorf("ARP about a VM that is neither a scoped question nor a host's answer: %s", f)
			}
			macs = macs[:1] // the destination was checked above
		}
		for _, mac := range macs {
			if _, ok := allowed[mac]; !ok {
				t.Errorf("MAC %s on the fabric is no host's uplink (virtual MACs must never be on the wire): %s", mac, f)
			}
		}
		if f.ethType != "0x0800" && f.ethType != "0x0806" {
			t.Errorf("non-IPv4/ARP frame on the fabric: %s", f)
		}
		if strings.HasPrefix(f.ipSrc, "10.") {
			tenant++
			// ICMP (1) and TCP (6) straight in IPv4: no UDP/GRE/IP-in-IP wrapper.
			if f.proto != "1" && f.proto != "6" {
				t.Errorf("tenant packet on the fabric is encapsulated or unexpected (ip.proto %s): %s", f.proto, f)
			}
			if strings.Count(":"+f.protocols+":", ":ip:") > 1 {
				t.Errorf("nested IPv4 header (encapsulation) on the fabric: %s", f)
			}
		}
	}
	if tenant < 6 {
		t.Fatalf("capture on the fabric saw only %d tenant packets; expected the pings and the TCP stream", tenant)
	}
	if questions == 0 || answers == 0 {
		t.Errorf("web1 -> web2 needed the ARP engine, but the fabric saw %d scoped questions and %d answers", questions, answers)
	}
}

const twoFarms = `name: %s
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}]
  - name: red
    subnets: [{name: web}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: db1, host: h2, subnet: blue/db}
  - {name: red1, host: h2, subnet: red/web}
  - {name: db2, host: h1, subnet: blue/db}
`

func TestPrivilegedInterSubnetAndInterFarmTrafficDroppedWithoutRules(t *testing.T) {
	testenv.RequireTool(t, "iperf3")
	l := upLab(t, twoFarms)
	web1, db1 := l.ip("web1"), l.ip("db1")
	h1Before, h2Before := l.metrics("h1"), l.metrics("h2")
	// db2 is in db1's subnet: its datagrams prove db1's capture live.
	w := l.watchVM("db1", "db2")
	proveLive(t, "start", w)

	if err := l.ping("web1", db1, 2); err == nil {
		t.Error("web1 reached db1 in another subnet with no rule")
	}
	if err := l.ping("red1", web1, 2); err == nil {
		t.Error("red1 reached web1 in another farm with no rule")
	}
	if out, err := l.in("web1", "iperf3", "-c", db1, "-t", "1", "--connect-timeout", "1000"); err == nil {
		t.Errorf("TCP web1 -> db1 connected without a rule:\n%s", out)
	}
	stopWatches(t, w)
	for _, f := range w.frames {
		if f.ipSrc != "" && subnetOf(f.ipSrc) != subnetOf(db1) {
			t.Errorf("db1 received a packet from outside its subnet: %s", f)
		}
	}
	if d := rise(h1Before, l.metrics("h1"), drops("not_visible")); d < 3 {
		t.Errorf("h1 not_visible drops rose by %v; want the pings and the SYN dropped before the wire", d)
	}
	if d := rise(h2Before, l.metrics("h2"), drops("not_visible")); d < 2 {
		t.Errorf("h2 not_visible drops rose by %v; want red1's pings dropped", d)
	}
}

const withRules = `name: %s
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}]
    rules:
      - {from: web, to: db, proto: tcp, port: 5432}
      - {from: web, to: db, proto: icmp}
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: db1, host: h2, subnet: blue/db}
`

func TestPrivilegedInterSubnetRuleOpensOnlyWhatItNamesInOneHop(t *testing.T) {
	testenv.RequireTool(t, "iperf3", "traceroute")
	l := upLab(t, withRules)
	web1, db1 := l.ip("web1"), l.ip("db1")

	// ping across the virtual gateway: allowed by the icmp rule, one hop.
	out, err := l.in("web1", "ping", "-c", "2", "-i", "0.2", "-W", "1", db1)
	if err != nil {
		t.Fatalf("web1 -> db1 ping (allowed by rule): %v\n%s", err, out)
	}
	if !strings.Contains(out, "ttl=63") {
		t.Errorf("reply did not cross exactly one (gateway) hop; want ttl=63:\n%s", out)
	}
	// The virtual gateway itself answers.
	if err := l.ping("web1", "10.1.1.1", 2); err != nil {
		t.Errorf("gateway ping: %v", err)
	}
	// traceroute sees exactly one hop, the gateway, then db1.
	tr, err := l.in("web1", "traceroute", "-I", "-n", "-q", "1", "-w", "1", "-m", "4", db1)
	if err != nil {
		t.Fatalf("traceroute: %v\n%s", err, tr)
	}
	var hops []string
	for _, line := range strings.Split(strings.TrimSpace(tr), "\n")[1:] {
		if f := strings.Fields(line); len(f) >= 2 {
			hops = append(hops, f[1])
		}
	}
	if len(hops) != 2 || hops[0] != "10.1.1.1" || hops[1] != db1 {
		t.Errorf("traceroute hops %v, want [10.1.1.1 %s]:\n%s", hops, db1, tr)
	}
	// TCP to the allowed port works, to another port does not.
	l.start("db1", "iperf3", "-s", "-p", "5432")
	l.start("db1", "iperf3", "-s", "-p", "5201")
	l.waitListening("db1", "tcp", 5432)
	l.waitListening("db1", "tcp", 5201)
	if o, err := l.in("web1", "iperf3", "-c", db1, "-p", "5432", "-n", "10M", "-C", "cubic"); err != nil || !strings.Contains(o, "receiver") {
		t.Errorf("TCP web1 -> db1:5432 (allowed) failed: %v\n%s", err, o)
	}
	before := l.metrics("h1")
	if o, err := l.in("web1", "iperf3", "-c", db1, "-p", "5201", "-t", "1", "--connect-timeout", "1000"); err == nil {
		t.Errorf("TCP web1 -> db1:5201 (no rule) connected:\n%s", o)
	}
	if d := rise(before, l.metrics("h1"), drops("not_visible")); d < 1 {
		t.Errorf("blocked SYN to db1:5201 not counted as not_visible on h1")
	}
	// The rule is one-way: db cannot start anything towards web.
	if err := l.ping("db1", web1, 2); err == nil {
		t.Error("db1 reached web1; the rule only opens web -> db")
	}
}
