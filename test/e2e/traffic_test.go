package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPrivilegedPingAndTCPBetweenVMsOnOneHostAndAcrossHosts(t *testing.T) {
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
		l.mustIn(dst.vm, "iperf3", "-s", "-1", "-D")
		waitFor(t, "iperf3 server on "+dst.vm, 5*time.Second, func() bool {
			out, _ := l.in(dst.vm, "ss", "-ltn", "sport = :5201")
			return strings.Contains(out, "5201")
		})
		out := l.mustIn("web1", "iperf3", "-c", dst.ip, "-n", "20M", "-C", "cubic")
		if !strings.Contains(out, "receiver") {
			t.Errorf("TCP web1 -> %s did not complete:\n%s", dst.vm, out)
		}
	}

	after := l.metrics("h1")
	for _, path := range []string{"local", "to_fabric", "from_fabric", "arp_reply"} {
		if after.at(forwards(path)) <= before.at(forwards(path)) {
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

// capture records packets on ifname inside node until the returned function
// is called; that function returns one line per packet with the requested
// tshark fields, tab-separated.
func (l *testLab) capture(node, ifname string, fields ...string) func() []string {
	stop, _ := l.captureFile(node, ifname, fields...)
	return stop
}

// captureFile is capture that also returns the pcap file being written.
func (l *testLab) captureFile(node, ifname string, fields ...string) (func() []string, string) {
	l.t.Helper()
	pcap := filepath.Join(l.t.TempDir(), node+".pcap")
	dump := l.start(node, "tcpdump", "-i", ifname, "-n", "-U", "--immediate-mode", "-w", pcap)
	waitFor(l.t, "tcpdump on "+node, 5*time.Second, func() bool {
		return strings.Contains(dump.Output(), "listening on")
	})
	return func() []string {
		// Let what is in flight land and tcpdump write it out (immediate
		// mode: without it packets wait in the ring for up to a second, and
		// a "nothing arrived" check would prove nothing).
		time.Sleep(500 * time.Millisecond)
		dump.Stop()
		args := []string{"-r", pcap, "-T", "fields"}
		for _, f := range fields {
			args = append(args, "-e", f)
		}
		out, err := exec.Command("tshark", args...).Output()
		if err != nil {
			l.t.Fatalf("tshark -r %s: %v", pcap, err)
		}
		var lines []string
		for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
			if line != "" {
				lines = append(lines, line)
			}
		}
		return lines
	}, pcap
}

func TestPrivilegedSpoofedSourceIPAndMACNeverArrive(t *testing.T) {
	l := upLab(t, quickstart)
	web1, web2 := l.ip("web1"), l.ip("web2")
	web2MAC := l.mac("web2", "eth0")
	// Pin web2's MAC in web1's neighbour table, so the spoofed frames below are
	// IPv4 (not ARP) and reach the anti-spoofing check as such.
	l.mustIn("web1", "ip", "neigh", "replace", web2, "lladdr", web2MAC, "dev", "eth0", "nud", "permanent")
	before := l.metrics("h1")
	got := l.capture("web2", "eth0", "ip.src", "eth.src", "icmp.type")

	// Legitimate pings first: the capture must see these, or it proves nothing.
	if err := l.ping("web1", web2, 2); err != nil {
		t.Fatal(err)
	}
	// A source IP that is not web1's (another VM's address in the subnet).
	spoofIP := "10.1.1.77"
	l.mustIn("web1", "ip", "addr", "add", spoofIP+"/32", "dev", "eth0")
	l.in("web1", "ping", "-c", "3", "-i", "0.2", "-W", "1", "-I", spoofIP, web2)
	l.mustIn("web1", "ip", "addr", "del", spoofIP+"/32", "dev", "eth0")
	// A source MAC that is not web1's.
	realMAC := l.mac("web1", "eth0")
	spoofMAC := "02:00:0a:01:01:63"
	l.mustIn("web1", "ip", "link", "set", "eth0", "address", spoofMAC)
	// Changing the MAC flushes the neighbour table, permanent entries too.
	l.mustIn("web1", "ip", "neigh", "replace", web2, "lladdr", web2MAC, "dev", "eth0", "nud", "permanent")
	l.in("web1", "ping", "-c", "3", "-i", "0.2", "-W", "1", web2)
	l.mustIn("web1", "ip", "link", "set", "eth0", "address", realMAC)
	// And legitimate pings last: the capture was live to the end.
	l.mustIn("web1", "ip", "neigh", "replace", web2, "lladdr", web2MAC, "dev", "eth0", "nud", "permanent")
	if err := l.ping("web1", web2, 2); err != nil {
		t.Fatal(err)
	}
	lines := got()

	var legit int
	for _, line := range lines {
		f := strings.Split(line, "\t")
		if len(f) < 3 || f[2] != "8" { // echo requests only
			continue
		}
		switch {
		case f[0] == spoofIP:
			t.Errorf("packet with spoofed source IP reached web2: %s", line)
		case f[1] == spoofMAC:
			t.Errorf("packet with spoofed source MAC reached web2: %s", line)
		case f[0] == web1:
			legit++
		}
	}
	if legit != 4 {
		t.Errorf("capture at web2 saw %d of web1's 4 legitimate echo requests (2 before, 2 after the spoofing); capture lines:\n%s", legit, strings.Join(lines, "\n"))
	}
	after := l.metrics("h1")
	if d := after.at(drops("spoofed_ip")) - before.at(drops("spoofed_ip")); d != 3 {
		t.Errorf("spoofed_ip drops rose by %v, want 3", d)
	}
	if d := after.at(drops("spoofed_mac")) - before.at(drops("spoofed_mac")); d != 3 {
		t.Errorf("spoofed_mac drops rose by %v, want 3", d)
		for k, v := range after.m {
			if v != before.m[k] {
				t.Logf("%s: %v -> %v", k, before.m[k], v)
			}
		}
	}
}

func TestPrivilegedFabricCarriesOnlyHostMACsAndPlainIPv4(t *testing.T) {
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
	got := l.capture("fabric", "br0", "eth.src", "eth.dst", "eth.type", "ip.src", "ip.dst", "ip.proto", "arp.opcode", "arp.dst.proto_ipv4")
	if err := l.ping("web1", l.ip("web2"), 3); err != nil {
		t.Fatal(err)
	}
	l.mustIn("web2", "iperf3", "-s", "-1", "-D")
	waitFor(t, "iperf3 server", 5*time.Second, func() bool {
		out, _ := l.in("web2", "ss", "-ltn", "sport = :5201")
		return strings.Contains(out, "5201")
	})
	l.mustIn("web1", "iperf3", "-c", l.ip("web2"), "-n", "5M", "-C", "cubic")
	lines := got()

	tenant, questions, answers := 0, 0, 0
	subnetScope := "03:00:0a:01:01:00" // blue/web's Ethernet multicast address
	for _, line := range lines {
		f := strings.Split(line, "\t")
		for len(f) < 8 {
			f = append(f, "")
		}
		if switchMACs[f[0]] && !strings.HasPrefix(f[3], "10.") {
			continue // the switch's own control traffic (IGMP from its ports)
		}
		if f[2] == "0x0806" && strings.HasPrefix(f[7], "10.") {
			// The ARP engine: a question for a VM goes to its subnet's
			// multicast address, never to broadcast; the answer is unicast
			// between hosts.
			switch {
			case f[6] == "1" && f[1] == subnetScope:
				questions++
			case f[6] == "2" && f[1] != "ff:ff:ff:ff:ff:ff":
				answers++
			case f[6] == "2":
				// an announcement of a VM that arrived on a host
			default:
				t.Errorf("ARP about a VM that is neither a scoped question nor a host's answer: %s", line)
			}
			f[1] = l.mac("h1", "uplink0") // checked above
		}
		for _, mac := range f[:2] {
			if _, ok := allowed[mac]; !ok {
				t.Errorf("MAC %s on the fabric is no host's uplink (virtual MACs must never be on the wire): %s", mac, line)
			}
		}
		if f[2] != "0x0800" && f[2] != "0x0806" {
			t.Errorf("non-IPv4/ARP frame on the fabric: %s", line)
		}
		if strings.HasPrefix(f[3], "10.") {
			tenant++
			// ICMP (1) and TCP (6) straight in IPv4: no UDP/GRE/IP-in-IP wrapper.
			if f[5] != "1" && f[5] != "6" {
				t.Errorf("tenant packet on the fabric is encapsulated or unexpected (ip.proto %s): %s", f[5], line)
			}
			if strings.Contains(f[3], ",") {
				t.Errorf("nested IPv4 header (encapsulation) on the fabric: %s", line)
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
`

func TestPrivilegedInterSubnetAndInterFarmTrafficDroppedWithoutRules(t *testing.T) {
	l := upLab(t, twoFarms)
	web1, db1 := l.ip("web1"), l.ip("db1")
	h1Before, h2Before := l.metrics("h1"), l.metrics("h2")
	got := l.capture("db1", "eth0", "ip.src")
	// db1's own gateway answers its pings: replies the capture must see,
	// before and after, or "nothing arrived" proves nothing.
	db1GW := l.node("db1").VM.Gateway
	if err := l.ping("db1", db1GW, 1); err != nil {
		t.Fatal(err)
	}

	if err := l.ping("web1", db1, 2); err == nil {
		t.Error("web1 reached db1 in another subnet with no rule")
	}
	if err := l.ping("red1", web1, 2); err == nil {
		t.Error("red1 reached web1 in another farm with no rule")
	}
	if out, err := l.in("web1", "iperf3", "-c", db1, "-t", "1", "--connect-timeout", "1000"); err == nil {
		t.Errorf("TCP web1 -> db1 connected without a rule:\n%s", out)
	}
	if err := l.ping("db1", db1GW, 1); err != nil {
		t.Fatal(err)
	}
	gatewayReplies := 0
	for _, src := range got() {
		switch src {
		case db1GW:
			gatewayReplies++
		case "", db1:
			// db1's own: its ARP for its gateway, its echo requests
		default:
			t.Errorf("db1 received a packet from outside its subnet: %s", src)
		}
	}
	if gatewayReplies != 2 {
		t.Errorf("the capture at db1 saw %d of the gateway's 2 replies: it was not live throughout", gatewayReplies)
	}
	if d := l.metrics("h1").at(drops("not_visible")) - h1Before.at(drops("not_visible")); d < 3 {
		t.Errorf("h1 not_visible drops rose by %v; want the pings and the SYN dropped before the wire", d)
	}
	if d := l.metrics("h2").at(drops("not_visible")) - h2Before.at(drops("not_visible")); d < 2 {
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
	waitFor(t, "iperf3 servers on db1", 5*time.Second, func() bool {
		o, _ := l.in("db1", "ss", "-ltn")
		return strings.Contains(o, ":5432") && strings.Contains(o, ":5201")
	})
	if o, err := l.in("web1", "iperf3", "-c", db1, "-p", "5432", "-n", "10M", "-C", "cubic"); err != nil || !strings.Contains(o, "receiver") {
		t.Errorf("TCP web1 -> db1:5432 (allowed) failed: %v\n%s", err, o)
	}
	before := l.metrics("h1")
	if o, err := l.in("web1", "iperf3", "-c", db1, "-p", "5201", "-t", "1", "--connect-timeout", "1000"); err == nil {
		t.Errorf("TCP web1 -> db1:5201 (no rule) connected:\n%s", o)
	}
	if d := l.metrics("h1").at(drops("not_visible")) - before.at(drops("not_visible")); d < 1 {
		t.Errorf("blocked SYN to db1:5201 not counted as not_visible on h1")
	}
	// The rule is one-way: db cannot start anything towards web.
	if err := l.ping("db1", web1, 2); err == nil {
		t.Error("db1 reached web1; the rule only opens web -> db")
	}
}
