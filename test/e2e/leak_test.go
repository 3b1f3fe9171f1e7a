package e2e

import (
	"fmt"
	"sort"
	"strings"
	"testing"
)

// leakLab is the quick start (examples/quickstart.yaml) plus db2, so that
// every VM has a peer in its subnet whose packets prove its capture live.
const leakLab = `name: %s
hosts: [{name: h1}, {name: h2}, {name: h3}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}]
    rules:
      - {from: web, to: db, proto: tcp, port: 5432}
      - {from: web, to: db, proto: icmp}
  - name: red
    subnets: [{name: web}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
  - {name: web3, host: h1, subnet: blue/web}
  - {name: db1, host: h3, subnet: blue/db}
  - {name: db2, host: h2, subnet: blue/db}
  - {name: red1, host: h1, subnet: red/web}
  - {name: red2, host: h3, subnet: red/web}
`

// leakPeers: each VM's peer in its own subnet, whose UDP to it must arrive.
var leakPeers = map[string]string{
	"web1": "web3", "web2": "web1", "web3": "web2",
	"db1": "db2", "db2": "db1",
	"red1": "red2", "red2": "red1",
}

func leakVMs() []string {
	vms := make([]string, 0, len(leakPeers))
	for vm := range leakPeers {
		vms = append(vms, vm)
	}
	sort.Strings(vms)
	return vms
}

// watchAll starts a proven-live capture on every VM of leakLab.
func (l *testLab) watchAll() map[string]*watch {
	ws := map[string]*watch{}
	for _, vm := range leakVMs() {
		ws[vm] = l.watchVM(vm, leakPeers[vm])
	}
	return ws
}

func values(m map[string]*watch) []*watch {
	var ws []*watch
	for _, vm := range leakVMs() {
		if w, ok := m[vm]; ok {
			ws = append(ws, w)
		}
	}
	return ws
}

// Unicast between farms that do not peer, and between subnets beyond what a
// rule names, over TCP, UDP and ICMP, on one host and across hosts: nothing
// arrives, and the sending host counts each packet as not_visible.
func TestLeakUnicastAcrossFarmsAndSubnetsOverTCPUDPAndICMP(t *testing.T) {
	l := upLab(t, leakLab)
	ws := l.watchAll()
	proveLive(t, "start", values(ws)...)

	type attack struct {
		what, from, to, host string
		tcpPorts             []int
		icmp                 bool
	}
	for _, a := range []attack{
		{"another farm, same host", "red1", "web3", "h1", []int{80}, true},
		{"another farm, across hosts", "red1", "web2", "h1", []int{80}, true},
		{"another farm, same host h3", "red2", "db1", "h3", []int{5432}, true},
		{"blue to red, across hosts", "web1", "red2", "h1", []int{80}, true},
		{"against the one-way rule, across hosts", "db1", "web1", "h3", []int{5432}, true},
		{"against the one-way rule, same host", "db2", "web2", "h2", []int{80}, true},
		// The rule names tcp/5432 and icmp: other ports and UDP stay shut.
		{"beyond the rule's port and protocol", "web1", "db1", "h1", []int{22}, false},
	} {
		t.Run(fmt.Sprintf("%s->%s %s", a.from, a.to, a.what), func(t *testing.T) {
			dst := l.ip(a.to)
			for _, port := range a.tcpPorts {
				d := l.dropDelta(a.host, func() {
					if err := l.tcpBlocked(a.from, dst, port); err != nil {
						t.Error(err)
					}
				}, "not_visible")
				if d["not_visible"] < 1 {
					t.Errorf("tcp/%d: not_visible on %s rose by %v; want the SYN counted", port, a.host, d["not_visible"])
				}
			}
			d := l.dropDelta(a.host, func() {
				for i := 0; i < 3; i++ {
					l.sendUDPFrom(a.from, dst, 0, 5432, 64, fmt.Sprintf("leak-udp-%s-%d", a.from, i))
				}
			}, "not_visible")
			if d["not_visible"] < 3 {
				t.Errorf("udp: not_visible on %s rose by %v; want the 3 datagrams", a.host, d["not_visible"])
			}
			if !a.icmp {
				return
			}
			d = l.dropDelta(a.host, func() {
				if err := l.ping(a.from, dst, 2); err == nil {
					t.Errorf("ping %s -> %s got replies", a.from, a.to)
				}
			}, "not_visible")
			if d["not_visible"] < 2 {
				t.Errorf("icmp: not_visible on %s rose by %v; want the 2 echo requests", a.host, d["not_visible"])
			}
		})
	}
	t.Run("a TTL-1 probe into another farm gets no time-exceeded from the gateway", func(t *testing.T) {
		d := l.dropDelta("h1", func() {
			out, err := l.in("red1", "ping", "-c", "2", "-i", "0.2", "-W", "1", "-t", "1", l.ip("web2"))
			if err == nil || strings.Contains(out, "exceeded") {
				t.Errorf("red1's TTL-1 probe towards web2 got an answer:\n%s", out)
			}
		}, "not_visible")
		if d["not_visible"] < 2 {
			t.Errorf("not_visible on h1 rose by %v; want the 2 probes, checked before the gateway hop", d["not_visible"])
		}
	})
	t.Run("an echo reply that answers nothing opens nothing", func(t *testing.T) {
		d := l.dropDelta("h3", func() {
			for i := 0; i < 3; i++ {
				l.sendEchoReply("db1", l.ip("web1"), 4000+i)
			}
		}, "not_visible")
		if d["not_visible"] < 3 {
			t.Errorf("not_visible on h3 rose by %v; want the 3 forged replies", d["not_visible"])
		}
	})

	stopWatches(t, values(ws)...)
	// In this test no VM was allowed anything outside its own subnet, so a
	// VM that received from another subnet, another farm or a gateway saw
	// a leak.
	for _, vm := range leakVMs() {
		own := l.ip(vm)
		var got []string
		for _, f := range ws[vm].frames {
			if f.ipSrc == "" {
				continue
			}
			if subnetOf(f.ipSrc) != subnetOf(own) || strings.HasSuffix(f.ipSrc, ".1") {
				got = append(got, f.String())
			}
		}
		if len(got) > 0 {
			t.Errorf("%s (%s) received from outside its subnet:\n%s", vm, own, strings.Join(got, "\n"))
		}
	}

	// After the captures: this one needs allowed traffic first.
	t.Run("db1 cannot ping web1 by reusing the echo id of web1's ping", func(t *testing.T) {
		// web1 pings db1 (the rule allows it) with echo id 4242 ...
		if out, err := l.in("web1", "ping", "-c", "1", "-W", "1", "-e", "4242", l.ip("db1")); err != nil {
			t.Fatalf("web1 -> db1 ping (allowed): %v\n%s", err, out)
		}
		// ... and db1 sends echo requests to web1 with that id.
		if out, err := l.in("db1", "ping", "-c", "2", "-i", "0.2", "-W", "1", "-e", "4242", l.ip("web1")); err == nil {
			t.Errorf("db1 opened pings to web1 against the one-way rule:\n%s", out)
		}
	})
}

// Broadcast and multicast reach their scope (checked positively here too)
// and nothing else: no other farm, no other subnet for broadcast and TTL-1
// multicast, no directed broadcast into another subnet or farm, no DHCP
// server answers from a VM.
func TestLeakBroadcastAndMulticastStayInTheirScope(t *testing.T) {
	l := upLab(t, leakLab)
	for _, vm := range []string{"red1", "db1"} {
		l.mustIn(vm, "ip", "route", "add", "224.0.0.0/4", "dev", "eth0")
	}
	ws := l.watchAll()
	proveLive(t, "start", values(ws)...)

	type send struct {
		from, dst string
		ttl       int
		msg       string
	}
	// who may receive each message; every other VM must not.
	want := map[string][]string{}
	sendAll := func(sends []send, to []string) {
		for _, s := range sends {
			want[s.msg] = to
			for i := 0; i < 2; i++ {
				l.sendUDPFrom(s.from, s.dst, 0, 9999, s.ttl, s.msg)
			}
		}
	}
	// red's broadcasts and multicasts leave h1 for the fabric; h2 holds no
	// red VM, so it drops them unseen (no_members). Only red2 gets them.
	d := l.dropDelta("h2", func() {
		sendAll([]send{
			{"red1", "10.2.1.255", 1, "red-subnet-broadcast"},
			{"red1", "255.255.255.255", 1, "red-limited-broadcast"},
			{"red1", "239.1.2.3", 1, "red-multicast-ttl1"},
			{"red1", "239.1.2.3", 4, "red-multicast-ttl4"},
		}, []string{"red2"})
	}, "no_members")
	if d["no_members"] < 8 {
		t.Errorf("no_members on h2 (no red VMs) rose by %v, want red's 8 datagrams", d["no_members"])
	}
	// db's subnet broadcast and TTL-1 multicast reach db2 only; h1, with
	// no db VM, drops them. TTL > 1 multicast is for the whole farm, but
	// crosses into another subnet only where a rule lets it: db may not
	// reach web, so it too stays with db2.
	d = l.dropDelta("h1", func() {
		sendAll([]send{
			{"db1", "10.1.2.255", 1, "db-subnet-broadcast"},
			{"db1", "255.255.255.255", 1, "db-limited-broadcast"},
			{"db1", "239.1.2.3", 1, "db-multicast-ttl1"},
			{"db1", "239.1.2.3", 4, "db-multicast-ttl4"},
		}, []string{"db2"})
	}, "no_members")
	if d["no_members"] < 6 {
		t.Errorf("no_members on h1 (no db VMs) rose by %v, want db's 6 datagrams", d["no_members"])
	}
	// A broadcast directed at another subnet's or farm's address is no
	// one's and crosses a subnet without a rule: dropped on the sending
	// host by whichever check comes first (no VM holds it: no_route; no
	// rule lets it cross: not_visible).
	d = l.dropDelta("h1", func() {
		sendAll([]send{
			{"web1", "10.1.2.255", 64, "web-to-db-broadcast"},
			{"red1", "10.1.1.255", 64, "red-to-blue-web-broadcast"},
			{"red1", "10.1.255.255", 64, "red-to-blue-farm-broadcast"},
		}, nil)
	}, "no_route", "not_visible")
	if n := d["no_route"] + d["not_visible"]; n < 6 {
		t.Errorf("no_route and not_visible on h1 rose by %v, want the 6 directed broadcasts", n)
	}
	// A VM playing DHCP server: its offers reach no one.
	d = l.dropDelta("h1", func() {
		want["rogue-dhcp-offer"] = nil
		for i := 0; i < 2; i++ {
			l.sendUDPFrom("web1", "255.255.255.255", 67, 68, 64, "rogue-dhcp-offer")
		}
	}, "rogue_dhcp")
	if d["rogue_dhcp"] < 2 {
		t.Errorf("rogue_dhcp on h1 rose by %v, want the 2 offers", d["rogue_dhcp"])
	}

	stopWatches(t, values(ws)...)
	for msg, to := range want {
		for _, vm := range leakVMs() {
			should := false
			for _, r := range to {
				should = should || r == vm
			}
			has := false
			for _, f := range ws[vm].frames {
				has = has || f.payload == msg
			}
			if has != should {
				t.Errorf("%s received %q: %v, want %v", vm, msg, has, should)
			}
		}
	}
	for _, vm := range leakVMs() {
		farm := strings.Join(strings.Split(l.ip(vm), ".")[:2], ".") + "."
		for _, f := range ws[vm].frames {
			if f.ipSrc != "" && !strings.HasPrefix(f.ipSrc, farm) {
				t.Errorf("%s received from another farm: %s", vm, f)
			}
		}
	}
}

// checkARPAtVMs asserts the one kind of ARP a VM may ever receive: a reply
// to itself giving the true binding (onehop's MAC for the address) of an
// address in its own subnet. No request from anyone, no other subnet's
// address, no forged binding.
func checkARPAtVMs(t *testing.T, l *testLab, ws map[string]*watch) {
	t.Helper()
	for _, vm := range leakVMs() {
		w, ok := ws[vm]
		if !ok {
			continue
		}
		own := l.ip(vm)
		for _, f := range w.frames {
			if f.arpOp == "" {
				continue
			}
			switch {
			case f.arpOp != "2":
				t.Errorf("%s received an ARP request (requests never reach a VM): %s", vm, f)
			case f.arpTPA != own:
				t.Errorf("%s received an ARP reply meant for %s: %s", vm, f.arpTPA, f)
			case subnetOf(f.arpSPA) != subnetOf(own):
				t.Errorf("%s learnt an address outside its subnet: %s", vm, f)
			case f.arpSHA != virtualMAC(f.arpSPA) || f.ethSrc != f.arpSHA:
				t.Errorf("%s received a forged binding (%s is at %s): %s", vm, f.arpSPA, virtualMAC(f.arpSPA), f)
			}
		}
	}
}

// checkNoVMARPOnFabric: no VM's own frame reaches the wire (the fabric
// carries host MACs), and any ARP on it that speaks of VMs (the hosts' ARP
// engines resolving a VM in a scope) states a true binding and stays inside
// one subnet.
func checkNoVMARPOnFabric(t *testing.T, fabric *watch) {
	t.Helper()
	for _, f := range fabric.frames {
		if f.arpOp == "" {
			continue
		}
		if strings.HasPrefix(f.ethSrc, "02:00:0a:") {
			t.Errorf("a VM's own ARP on the fabric: %s", f)
		}
		if !strings.HasPrefix(f.arpSPA, "10.") {
			continue
		}
		if f.arpSHA != virtualMAC(f.arpSPA) {
			t.Errorf("a forged binding on the fabric (%s is at %s): %s", f.arpSPA, virtualMAC(f.arpSPA), f)
		}
		if strings.HasPrefix(f.arpTPA, "10.") && subnetOf(f.arpSPA) != subnetOf(f.arpTPA) {
			t.Errorf("ARP across subnets on the fabric: %s", f)
		}
	}
}

// A VM's ARP for an address of another subnet or farm (or another
// subnet's gateway) gets no answer and reaches no one, on the host or the
// fabric; ARP inside the subnet is answered, so the silence is the
// datapath's.
func TestLeakARPNeverCrossesSubnetsOrFarms(t *testing.T) {
	l := upLab(t, leakLab)
	ws := l.watchAll()
	fabric := l.watchFabric("web1", "web2")
	proveLive(t, "start", append(values(ws), fabric)...)

	ask := func(from, target string) string {
		mac, ip := l.mac(from, "eth0"), l.ip(from)
		return arpFrame(1, mac, "ff:ff:ff:ff:ff:ff", mac, ip, "00:00:00:00:00:00", target)
	}
	// In-subnet questions, answered on the asker's host.
	l.sendFrames("web1", ask("web1", l.ip("web2")))
	l.sendFrames("red1", ask("red1", l.ip("red2")))

	questions := map[string][]string{
		"red1": {l.ip("web3"), l.ip("web2"), "10.1.1.1"},   // blue, on red1's host and elsewhere; blue's gateway
		"web1": {l.ip("db1"), "10.1.2.1", l.ip("red2")},    // another subnet, its gateway, another farm
		"db1":  {l.ip("web1"), l.ip("web2"), l.ip("red2")}, // against the one-way rule; another farm on db1's host
		"red2": {l.ip("db1"), "10.1.2.1", l.ip("db2")},     // another farm on red2's host
		"db2":  {l.ip("web2"), "10.1.1.1", "10.2.1.1"},     // the web VM on db2's host; other gateways
		"web2": {l.ip("db2"), l.ip("red1"), "10.1.2.1"},    // the db VM on web2's host
		"web3": {l.ip("red1"), l.ip("db1"), "10.2.1.1"},    // the red VM on web3's host
	}
	hostOf := map[string]string{"web1": "h1", "web3": "h1", "red1": "h1", "web2": "h2", "db2": "h2", "db1": "h3", "red2": "h3"}
	for _, vm := range leakVMs() {
		var frames []string
		for _, target := range questions[vm] {
			frames = append(frames, ask(vm, target), ask(vm, target))
		}
		d := l.dropDelta(hostOf[vm], func() { l.sendFrames(vm, frames...) }, "arp_other_subnet")
		if d["arp_other_subnet"] != float64(len(frames)) {
			t.Errorf("%s's %d cross-subnet ARP requests: arp_other_subnet on %s rose by %v", vm, len(frames), hostOf[vm], d["arp_other_subnet"])
		}
	}

	stopWatches(t, append(values(ws), fabric)...)
	checkARPAtVMs(t, l, ws)
	checkNoVMARPOnFabric(t, fabric)
	for _, in := range [][2]string{{"web1", "web2"}, {"red1", "red2"}} {
		answered := false
		for _, f := range ws[in[0]].frames {
			answered = answered || (f.arpOp == "2" && f.arpSPA == l.ip(in[1]))
		}
		if !answered {
			t.Errorf("%s's ARP for %s (same subnet) was not answered: the datapath's ARP answers are broken, so silence proves nothing", in[0], in[1])
		}
	}
}

// A VM that forges ARP (gratuitous requests and replies claiming other VMs'
// addresses or a gateway, unicast replies aimed at a victim, a forged source
// MAC) changes no other VM's neighbour table: the frames never leave its vif.
// The premise holds: delivered, a unicast reply for an address the victim
// already has rewrites that entry (Linux accepts it once the entry is older
// than its 1 s locktime), so unchanged tables say the datapath stopped it.
func TestLeakARPPoisoningChangesNoNeighbourTable(t *testing.T) {
	l := upLab(t, leakLab)
	victims := []string{"web2", "web3", "red1", "db1"}
	// Fill the victims' tables: each learns the attacker, a peer, its gateway.
	for _, p := range [][2]string{
		{"web2", l.ip("web1")}, {"web2", l.ip("web3")}, {"web2", "10.1.1.1"},
		{"web3", l.ip("web1")}, {"web3", l.ip("web2")}, {"web3", "10.1.1.1"},
		{"red1", l.ip("red2")}, {"red1", "10.2.1.1"},
		{"db1", l.ip("db2")}, {"db1", "10.1.2.1"},
	} {
		if err := l.ping(p[0], p[1], 1); err != nil {
			t.Fatal(err)
		}
	}
	before := map[string]map[string]string{}
	for _, vm := range victims {
		before[vm] = l.neighbours(vm)
		if len(before[vm]) < 2 {
			t.Fatalf("%s's neighbour table is too empty to show anything: %v", vm, before[vm])
		}
	}
	ws := map[string]*watch{}
	for _, vm := range victims {
		ws[vm] = l.watchVM(vm, map[string]string{"web2": "web3", "web3": "web2", "red1": "red2", "db1": "db2"}[vm])
	}
	fabric := l.watchFabric("web3", "web2")
	proveLive(t, "start", append(values(ws), fabric)...)

	me, myIP := l.mac("web1", "eth0"), l.ip("web1")
	bcast, zero := "ff:ff:ff:ff:ff:ff", "00:00:00:00:00:00"
	web2, web3 := l.ip("web2"), l.ip("web3")
	web2MAC, web3MAC := l.mac("web2", "eth0"), l.mac("web3", "eth0")
	spoofed := []string{
		arpFrame(1, me, bcast, me, web3, zero, web3),                  // gratuitous request: "web3 is at web1's MAC"
		arpFrame(2, me, bcast, me, web2, bcast, web2),                 // gratuitous reply: "web2 is at web1's MAC"
		arpFrame(2, me, web3MAC, me, "10.1.1.1", web3MAC, web3),       // to web3 (same host): "the gateway is at web1's MAC"
		arpFrame(2, me, web2MAC, me, "10.1.1.1", web2MAC, web2),       // to web2 (across hosts): the same
		arpFrame(2, me, bcast, me, l.ip("red1"), bcast, l.ip("red1")), // another farm's VM on the same host
		arpFrame(2, me, bcast, me, "10.1.2.1", bcast, "10.1.2.1"),     // another subnet's gateway
	}
	var frames []string
	for i := 0; i < 3; i++ {
		frames = append(frames, spoofed...)
	}
	forgedMAC := arpFrame(2, web3MAC, web2MAC, web3MAC, "10.1.1.1", web2MAC, web2) // as web3: "the gateway is at web3's MAC"
	ownReply := arpFrame(2, me, bcast, me, myIP, bcast, myIP)                      // true, but a reply: VMs' replies never leave
	d := l.dropDelta("h1", func() {
		l.sendFrames("web1", frames...)
		l.sendFrames("web1", forgedMAC, forgedMAC, forgedMAC)
		l.sendFrames("web1", ownReply, ownReply, ownReply)
	}, "arp_spoofed", "spoofed_mac", "arp_not_request")
	for reason, want := range map[string]float64{"arp_spoofed": float64(len(frames)), "spoofed_mac": 3, "arp_not_request": 3} {
		if d[reason] != want {
			t.Errorf("%s on h1 rose by %v, want %v", reason, d[reason], want)
		}
	}

	stopWatches(t, append(values(ws), fabric)...)
	checkARPAtVMs(t, l, ws)
	checkNoVMARPOnFabric(t, fabric)
	for _, vm := range victims {
		after := l.neighbours(vm)
		for ip, mac := range before[vm] {
			if after[ip] != mac {
				t.Errorf("%s's neighbour %s changed from %s to %q", vm, ip, mac, after[ip])
			}
		}
		for ip, mac := range after {
			if mac != virtualMAC(ip) {
				t.Errorf("%s believes %s is at %s; it is at %s", vm, ip, mac, virtualMAC(ip))
			}
		}
	}
}
