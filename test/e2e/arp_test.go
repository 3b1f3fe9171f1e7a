package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
)

// Three hosts; blue routes web -> db, green has proxy ARP on and lets a
// reach b by ping.
const arpEngine = `name: %s
hosts: [{name: h1}, {name: h2}, {name: h3}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}]
    rules: [{from: web, to: db}]
  - name: green
    proxy_arp: true
    subnets: [{name: a}, {name: b}]
    rules: [{from: a, to: b, proto: icmp}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
  - {name: db1, host: h3, subnet: blue/db}
  - {name: g1, host: h1, subnet: green/a}
  - {name: g2, host: h2, subnet: green/b}
`

func arpEvent(event string) string {
	return fmt.Sprintf(`onehop_arp_engine_events_total{event="%s"}`, event)
}

// neighMAC is the MAC a VM's neighbour table holds for ip ("" if none).
func (l *testLab) neighMAC(vm, ip string) string {
	l.t.Helper()
	out := l.mustIn(vm, "ip", "neigh", "show", ip, "dev", "eth0")
	f := strings.Fields(out)
	for i := range f {
		if f[i] == "lladdr" && i+1 < len(f) {
			return f[i+1]
		}
	}
	return ""
}

func TestPrivilegedARPEngineLearnsOnDemand(t *testing.T) {
	l := upLab(t, arpEngine)
	web2, db1 := l.ip("web2"), l.ip("db1")

	// Nothing is pushed: h1 knows no other host's VM before anyone speaks.
	if n := l.metrics("h1").at("onehop_mapping_table_entries"); n != 0 {
		t.Fatalf("h1's mapping table holds %v entries before any traffic; want 0 (learned on demand)", n)
	}
	if c := l.metrics("h1").at("onehop_mapping_table_capacity"); c < 64 {
		t.Fatalf("mapping table capacity %v", c)
	}

	// Same subnet, another host: web1's ARP goes to blue/web's multicast
	// address, h2 answers, and web1 gets web2's (derived) MAC.
	h1, h2 := l.metrics("h1"), l.metrics("h2")
	if err := l.ping("web1", web2, 2); err != nil {
		t.Fatal(err)
	}
	if got, want := l.neighMAC("web1", web2), l.mac("web2", "eth0"); got != want {
		t.Errorf("web1's neighbour entry for web2 is %q, want web2's MAC %s", got, want)
	}
	h1b, h2b := l.metrics("h1"), l.metrics("h2")
	for _, c := range []struct {
		host      string
		before    metricSet
		after     metricSet
		key, what string
	}{
		{"h1", h1, h1b, forwards("arp_to_fabric"), "web1's ARP sent to the subnet's multicast address"},
		{"h2", h2, h2b, forwards("arp_answered"), "the question answered by web2's host"},
		{"h1", h1, h1b, forwards("arp_learned"), "the answer learned"},
		{"h1", h1, h1b, forwards("arp_reply"), "the answer handed to web1"},
	} {
		if rise(c.before, c.after, c.key) < 1 {
			t.Errorf("%s: %s did not rise (%s)", c.host, c.key, c.what)
		}
	}
	if n := h1b.at("onehop_mapping_table_entries"); n < 1 {
		t.Errorf("h1's mapping table has %v entries after web1 talked to web2", n)
	}

	// Another subnet: web1 only ARPs for its gateway, so h1 first meets
	// db1's address in a packet. That packet is held while the engine
	// asks, then sent. First a UDP datagram (its checksum left to offload
	// by the VM's stack must arrive whole), then a ping.
	sink := l.start("db1", "python3", "-c", `import socket
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
s.bind(("0.0.0.0",9999))
s.settimeout(5)
print("got", s.recv(100).decode(), flush=True)`)
	l.waitListening("db1", "udp", 9999)
	l.sendUDP("web1", db1, 64, "first-datagram")
	testenv.Eventually(t, "db1 to receive web1's first datagram (held, then released)", 5*time.Second, func() bool {
		return strings.Contains(sink.Output(), "got first-datagram")
	})
	out, err := l.in("web1", "ping", "-c", "1", "-W", "3", db1)
	if err != nil {
		t.Fatalf("first ping web1 -> db1 (routed; held while resolved): %v\n%s", err, out)
	}
	h1c, h3 := l.metrics("h1"), l.metrics("h3")
	held, released, resolved := h1c.at(arpEvent("held")), h1c.at(arpEvent("released")), h1c.at(arpEvent("resolved"))
	if held < 1 || released < 1 || resolved < 1 {
		t.Errorf("h1's engine: held %v released %v resolved %v; want each >= 1", held, released, resolved)
	}
	// h3 learned web1's host from the packet itself: its reply needed no
	// question of its own.
	if n := h3.at(arpEvent("held")); n != 0 {
		t.Errorf("h3 held %v packets; the reply's destination was learned from the request", n)
	}

	// An address nobody holds: web1 is forced to believe it exists; the
	// engine asks, gets no answer, drops the packet and says so.
	ghost := strings.TrimSuffix(web2, ".3") + ".200"
	l.mustIn("web1", "ip", "neigh", "replace", ghost, "lladdr", "02:00:0a:01:01:c8", "dev", "eth0", "nud", "permanent")
	if out, err := l.in("web1", "ping", "-c", "1", "-W", "2", ghost); err == nil {
		t.Fatalf("ping to an address no VM holds was answered:\n%s", out)
	}
	testenv.Eventually(t, "h1's engine to give up on "+ghost, 5*time.Second, func() bool {
		m := l.metrics("h1")
		return m.at(arpEvent("unresolved")) >= 1 && m.at(arpEvent("discarded")) >= 1
	})
	stats, err := l.cli("stats", "--node", "h1")
	if err != nil || !strings.Contains(stats, "mapping table:") || !strings.Contains(stats, "ARP engine:") {
		t.Errorf("onehop stats shows no mapping table / ARP engine: %v\n%s", err, stats)
	}
}

func TestPrivilegedProxyARPAnswersForOtherSubnetsOnlyWhereTheFarmAsks(t *testing.T) {
	l := upLab(t, arpEngine)
	g2, db1 := l.ip("g2"), l.ip("db1")
	// Make each VM believe the other subnet is on its link, as a guest
	// with a wider netmask would: it then ARPs for the address itself.
	l.mustIn("g1", "ip", "route", "add", g2, "dev", "eth0")
	l.mustIn("web1", "ip", "route", "add", db1, "dev", "eth0")

	// green has proxy ARP: the gateway's MAC answers, and routing does the rest.
	if err := l.ping("g1", g2, 2); err != nil {
		t.Fatalf("green (proxy ARP on): %v", err)
	}
	gw := l.ip("g1")
	gw = gw[:strings.LastIndexByte(gw, '.')] + ".1"
	if got, want := l.neighMAC("g1", g2), gatewayMAC(gw); got != want {
		t.Errorf("g1's neighbour entry for %s is %q, want the gateway's MAC %s", g2, got, want)
	}

	// blue has not: the ARP is dropped and counted, nothing gets through.
	before := l.metrics("h1")
	if out, err := l.in("web1", "ping", "-c", "2", "-i", "0.2", "-W", "1", db1); err == nil {
		t.Fatalf("blue (proxy ARP off): web1 reached %s by ARPing for it directly:\n%s", db1, out)
	}
	if d := rise(before, l.metrics("h1"), drops("arp_other_subnet")); d < 1 {
		t.Errorf("web1's ARP for another subnet was not counted as arp_other_subnet")
	}
}

// gatewayMAC is the virtual MAC of a gateway address: 02:00 and its bytes,
// as a VM's (virtualMAC).
func gatewayMAC(ip string) string { return virtualMAC(ip) }

const quickRefresh = `name: %s
arp: {refresh: 2s}
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
`

func TestPrivilegedMappingInUseIsConfirmedByUnicastToItsHost(t *testing.T) {
	l := upLab(t, quickRefresh)
	web2 := l.ip("web2")
	h2MAC := l.mac("h2", "uplink0")
	// A one-way stream: nothing comes back from web2 to confirm the entry,
	// so h1's engine must ask, and ask h2 directly.
	sink := l.start("web2", "python3", "-c", `import socket
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
s.bind(("0.0.0.0",9999))
while True: s.recv(2048)`)
	defer sink.Stop()
	w := l.watchFabric("web1", "web2")
	proveLive(t, "start", w)
	before := l.metrics("h1")
	l.mustIn("web1", "python3", "-c", `import socket,sys,time
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
for i in range(60):
    s.sendto(b"x",(sys.argv[1],9999)); time.sleep(0.1)`, web2)
	stopWatches(t, w)
	unicast := 0
	for _, f := range w.frames {
		if f.arpOp == "1" && f.arpTPA == web2 && f.ethDst == h2MAC {
			unicast++
		}
	}
	after := l.metrics("h1")
	if unicast == 0 || rise(before, after, arpEvent("unicast_request")) < 1 {
		var lines []string
		for _, f := range w.frames {
			lines = append(lines, f.String())
		}
		t.Fatalf("no refresh question unicast to h2 during 6 s of one-way traffic (fabric saw %d, engine counted %v):\n%s",
			unicast, rise(before, after, arpEvent("unicast_request")), strings.Join(lines, "\n"))
	}
	if m, lost := after.at(arpEvent("multicast_request")), after.at(arpEvent("lost")); m != 0 || lost != 0 {
		t.Errorf("h2 answered, yet the engine asked by multicast %v times / lost %v entries", m, lost)
	}
	if n := rise(before, after, arpEvent("refreshed")); n < 1 {
		t.Errorf("refreshed rose by %v, want >= 1", n)
	}
}
