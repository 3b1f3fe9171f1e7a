package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/testenv"
	"github.com/onehop/onehop/internal/trace"
)

const traceLab = `name: %s
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}]
    rules:
      - {from: web, to: db, proto: tcp, port: 5432}
vms:
  - name: web1
    host: h1
    subnet: blue/web
    firewall:
      rules:
        - {dir: out, proto: tcp, port: "22", action: deny}
  - {name: web2, host: h2, subnet: blue/web}
  - {name: db1, host: h2, subnet: blue/db}
`

// traceJSON runs onehop trace -o json against the lab.
func (l *testLab) traceJSON(args ...string) trace.Report {
	l.t.Helper()
	out, err := l.cli(append([]string{"trace"}, append(args, "-o", "json")...)...)
	if err != nil {
		l.t.Fatalf("onehop trace %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	var r trace.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		l.t.Fatalf("onehop trace %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return r
}

// For each drop the demo shows (a forged source, no rule between subnets,
// the VM's own firewall) onehop trace names the reason a real packet sent
// just after is counted for: the real packet's counter moves, the trace's
// did not. The allowed path names the rule by the id `rule list` gives it,
// the host it goes to and the interface it is delivered into there.
func TestPrivilegedTraceGivesTheVerdictOfTheRealPacketAndCountsNothing(t *testing.T) {
	l := upLab(t, traceLab)
	web2, db1 := l.ip("web2"), l.ip("db1")

	// The ids the operator sees.
	out, err := l.cli("rule", "list", "-o", "json")
	if err != nil {
		t.Fatalf("rule list: %v\n%s", err, out)
	}
	var rules []struct {
		Farm string `json:"farm"`
		ID   uint32 `json:"id"`
		Port uint16 `json:"port"`
	}
	if err := json.Unmarshal([]byte(out), &rules); err != nil || len(rules) != 1 {
		t.Fatalf("rule list: %v\n%s", err, out)
	}
	out, err = l.cli("firewall", "list", "blue/web/web1", "-o", "json")
	if err != nil {
		t.Fatalf("firewall list: %v\n%s", err, out)
	}
	var fw struct {
		Rules []struct {
			ID uint32 `json:"id"`
		} `json:"rules"`
	}
	if err := json.Unmarshal([]byte(out), &fw); err != nil || len(fw.Rules) != 1 {
		t.Fatalf("firewall list: %v\n%s", err, out)
	}

	cases := []struct {
		name, host, reason string
		args               []string
		real               func()
	}{
		{"forged source", "h1", "spoofed_ip",
			[]string{"blue/web/web1", web2, "--proto", "udp", "--dport", "9", "--src-ip", "10.1.1.99"},
			func() {
				// The VM forges its source with a raw socket.
				l.mustIn("web1", "python3", "-c", `import socket
s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_RAW)
import struct
ip=struct.pack("!BBHHHBBH4s4s",0x45,0,28,1,0,64,17,0,socket.inet_aton("10.1.1.99"),socket.inet_aton("`+web2+`"))
s.sendto(ip+struct.pack("!HHHH",40000,9,8,0),("`+web2+`",0))`)
			}},
		{"no rule from web to db on port 80", "h1", "not_visible",
			[]string{"blue/web/web1", "blue/db/db1", "--dport", "80"},
			func() {
				if err := l.tcpBlocked("web1", db1, 80); err != nil {
					t.Error(err)
				}
			}},
		{"web1's firewall refuses ssh out", "h1", "firewall_out",
			[]string{"blue/web/web1", "blue/web/web2", "--dport", "22"},
			func() {
				if err := l.tcpBlocked("web1", web2, 22); err != nil {
					t.Error(err)
				}
			}},
	}
	for _, c := range cases {
		var rep trace.Report
		d := l.dropDelta(c.host, func() { rep = l.traceJSON(c.args...) }, c.reason)
		if rep.Verdict != "dropped" || rep.Drop != c.reason || rep.DropHost != c.host {
			t.Errorf("%s: trace says %s %s on %s, want dropped %s on %s\n%v", c.name, rep.Verdict, rep.Drop, rep.DropHost, c.reason, c.host, rep.Hops)
		}
		if d[c.reason] != 0 {
			t.Errorf("%s: the trace moved %s's %s counter by %v", c.name, c.host, c.reason, d[c.reason])
		}
		if d := l.dropDelta(c.host, c.real, c.reason); d[c.reason] < 1 {
			t.Errorf("%s: the real packet did not move %s's %s counter (%v): the trace's verdict is not the datapath's", c.name, c.host, c.reason, d)
		}
	}
	// The firewall drop names web1's rule by its id.
	rep := l.traceJSON("blue/web/web1", "blue/web/web2", "--dport", "22")
	if f := rep.Hops[0].Firewall; len(f) != 1 || f[0].ID != fw.Rules[0].ID || f[0].Dir != "out" || f[0].Allow {
		t.Errorf("firewall drop: trace names %+v, want web1's out rule %d denying", f, fw.Rules[0].ID)
	}

	// The allowed path. Until h1's mapping table knows db1 a packet is
	// held while the agent asks (and the trace says so); a real SYN has
	// it asked and learned, then the trace follows the packet to h2.
	rep = l.traceJSON("blue/web/web1", "blue/db/db1", "--dport", "5432")
	if rep.Verdict != "held" || !rep.Hops[0].Run.Ask {
		t.Errorf("web1 -> db1 before h1 knows where db1 is: verdict %s (ask %v), want held and asked for", rep.Verdict, rep.Hops[0].Run.Ask)
	}
	l.in("web1", "timeout", "1", "bash", "-c", fmt.Sprintf("exec 3<>/dev/tcp/%s/5432", db1))
	testenv.Eventually(t, "h1 learns where db1 is", 10*time.Second, func() error {
		if r := l.traceJSON("blue/web/web1", "blue/db/db1", "--dport", "5432"); r.Verdict == "held" {
			return fmt.Errorf("still held")
		}
		return nil
	})
	// Rule, host, delivery target; nothing counted.
	before1, before2 := l.metrics("h1"), l.metrics("h2")
	rep = l.traceJSON("blue/web/web1", "blue/db/db1", "--dport", "5432")
	after1, after2 := l.metrics("h1"), l.metrics("h2")
	if rep.Verdict != "delivered" || len(rep.Hops) != 2 {
		t.Fatalf("web1 -> db1:5432: verdict %s over %d hops, want delivered over 2\n%+v", rep.Verdict, len(rep.Hops), rep.Hops)
	}
	h1, h2 := rep.Hops[0], rep.Hops[1]
	if len(h1.Rules) != 1 || h1.Rules[0].ID != rules[0].ID || h1.Rules[0].Farm != "blue" || h1.NextHost != "h2" || h1.Host != "h1" {
		t.Errorf("sending hop: rules %+v, next host %q, want blue's rule %d and h2", h1.Rules, h1.NextHost, rules[0].ID)
	}
	if len(h2.Rules) != 1 || h2.Rules[0].ID != rules[0].ID || h2.Host != "h2" || h2.Run.ToKind != "peer" {
		t.Errorf("receiving hop: rules %+v on %s, delivered %s, want blue's rule %d on h2, into the veth's peer", h2.Rules, h2.Host, h2.Run.ToKind, rules[0].ID)
	}
	if iface := l.node("db1").VM.Interface; h2.Run.ToName != iface {
		t.Errorf("receiving hop delivers into %q (ifindex %d), want db1's vif %q", h2.Run.ToName, h2.Run.To, iface)
	}
	for _, k := range []struct {
		b, a   metricSet
		metric string
	}{{before1, after1, forwards("to_fabric")}, {before1, after1, forwards("routed")}, {before2, after2, forwards("from_fabric")}} {
		if d := rise(k.b, k.a, k.metric); d != 0 {
			t.Errorf("the allowed trace moved %s on %s by %v", k.metric, k.a.host, d)
		}
	}
	// The text a person reads says the same.
	text, err := l.cli("trace", "blue/web/web1", "blue/db/db1", "--dport", "5432")
	for _, want := range []string{fmt.Sprintf("rule %d of farm blue", rules[0].ID), "one hop to host h2", "delivered: into blue/db/db1", "verdict: delivered"} {
		if err != nil || !strings.Contains(text, want) {
			t.Errorf("onehop trace (text) lacks %q: %v\n%s", want, err, text)
		}
	}
	t.Logf("onehop trace blue/web/web1 blue/db/db1 --dport 5432:\n%s", text)
	// Bad input: one line naming what is wrong.
	for args, want := range map[string]string{
		"blue/web/nope blue/db/db1 --dport 5432": "vm blue/web/nope: not found",
		"blue/web/web1 blue/db/db1":              "dport: required for tcp",
		"blue/web/web1 db1 --dport 1":            `to: "db1": want a VM (farm/subnet/vm), a sliver (host/sliver) or an IPv4 address`,
	} {
		out, err := l.cli(append([]string{"trace"}, strings.Fields(args)...)...)
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("onehop trace %s: want an error saying %q, got %v\n%s", args, want, err, out)
		}
	}

	// And the real SYN goes the same way: h2 takes it in from the fabric.
	b2 := l.metrics("h2")
	l.in("web1", "timeout", "1", "bash", "-c", fmt.Sprintf("exec 3<>/dev/tcp/%s/5432", db1))
	if d := rise(b2, l.metrics("h2"), forwards("from_fabric")); d < 1 {
		t.Errorf("the real SYN to db1:5432 was not taken in on h2 (from_fabric rose by %v)", d)
	}

	// An address nobody holds yet: held and asked for, by a real packet;
	// the trace asks nothing.
	rep = l.traceJSON("blue/web/web1", "10.1.1.77", "--proto", "udp", "--dport", "9")
	if rep.Verdict != "held" || !rep.Hops[0].Run.Ask {
		t.Errorf("unknown destination: verdict %s (ask %v), want held and asked for\n%v", rep.Verdict, rep.Hops[0].Run.Ask, rep.Hops[0].Steps)
	}
}

// A sliver's frame and an external's take port space's verdict: a trace
// from s1 from s2's port is the drop a real frame is counted for, one from
// its own port leaves h1's uplink; from an external a trace to s1's port
// is delivered into s1's link (and a real datagram reaches s1), to a port
// nobody leases goes to h1's stack, and to a VM's address straight from
// the outside is the fabric-trust drop a real packet meets. No trace moves
// a counter.
func TestPrivilegedTraceFromASliverAndAnExternalGivesTheRealVerdictAndCountsNothing(t *testing.T) {
	l := upLab(t, portshare)
	pub, inet, web1 := l.addr("h1", "uplink0"), l.addr("inet", "eth0"), l.ip("web1")
	l.serveName("s1", "udp", 10022)
	s1In := `onehop_sliver_packets_total{dir="in",sliver="s1"}`
	s1Out := `onehop_sliver_packets_total{dir="out",sliver="s1"}`

	// From s1, from s2's port: refused, as a real frame is.
	var rep trace.Report
	d := l.dropDelta("h1", func() {
		rep = l.traceJSON("h1/s1", inet, "--proto", "udp", "--sport", "10150", "--dport", "9000")
	}, "ps_foreign_port")
	if rep.Verdict != "dropped" || rep.Drop != "ps_foreign_port" || rep.DropHost != "h1" || rep.From.Kind != trace.KindSliver || rep.Hops[0].Program != trace.ProgramSliver {
		t.Errorf("s1 from s2's port: trace says %s %s on %s (from %s, program %s), want dropped ps_foreign_port on h1 by the sliver program\n%v",
			rep.Verdict, rep.Drop, rep.DropHost, rep.From.Kind, rep.Hops[0].Program, rep.Hops)
	}
	if d["ps_foreign_port"] != 0 {
		t.Errorf("the trace moved h1's ps_foreign_port by %v", d["ps_foreign_port"])
	}
	if d := l.dropDelta("h1", func() {
		l.mustIn("s1", "python3", "-c", rawUDP, pub, inet, "10150", "9000", "foreign")
	}, "ps_foreign_port"); d["ps_foreign_port"] < 1 {
		t.Errorf("s1's real frame from s2's port did not move ps_foreign_port (%v): the trace's verdict is not the datapath's", d)
	}

	// From s1's own port: out of h1's uplink, beyond onehop.
	b := l.metrics("h1")
	rep = l.traceJSON("h1/s1", inet, "--proto", "udp", "--sport", "10001", "--dport", "9000")
	a := l.metrics("h1")
	if rep.Verdict != "to fabric" || len(rep.Hops) != 1 || !slices.Contains(rep.Hops[0].Run.Forwards, "from_sliver") || rep.Hops[0].Run.ToName != "uplink0" {
		t.Errorf("s1 from its own port: %s over %d hops, want to fabric out of uplink0 by from_sliver\n%+v", rep.Verdict, len(rep.Hops), rep.Hops)
	}
	if dd := rise(b, a, s1Out); dd != 0 {
		t.Errorf("the trace moved %s by %v", s1Out, dd)
	}
	l.sendUDPFrom("s1", inet, 10001, 9000, 64, "own")
	if dd := rise(a, l.metrics("h1"), s1Out); dd < 1 {
		t.Errorf("s1's real datagram from its own port did not move %s (%v)", s1Out, dd)
	}

	// From the Internet to s1's port: into s1's link on h1.
	b = l.metrics("h1")
	rep = l.traceJSON(inet, "h1/s1", "--proto", "udp", "--sport", "53", "--dport", "10022")
	a = l.metrics("h1")
	if rep.Verdict != "delivered" || rep.From.Kind != trace.KindExternal || rep.To.IP != pub || len(rep.Hops) != 1 || rep.Hops[0].Host != "h1" ||
		rep.Hops[0].Program != trace.ProgramUplink || rep.Hops[0].Run.ToName != intent.SliverIfname("s1", 0) {
		t.Errorf("inet -> s1:10022: %s on %d hops, want delivered by h1's uplink program into %s\n%+v", rep.Verdict, len(rep.Hops), intent.SliverIfname("s1", 0), rep.Hops)
	}
	if dd := rise(b, a, s1In); dd != 0 {
		t.Errorf("the trace moved %s by %v", s1In, dd)
	}
	if got, err := l.whoIs("inet", "udp", pub, 10022, 53); err != nil || got != "s1" {
		t.Errorf("a real datagram from inet to %s:10022 was answered by %q (%v), want s1 as the trace said", pub, got, err)
	}
	if dd := rise(a, l.metrics("h1"), s1In); dd < 1 {
		t.Errorf("the real datagram did not move %s (%v)", s1In, dd)
	}
	// To a port nobody leases: h1's own.
	if rep = l.traceJSON(inet, pub, "--proto", "udp", "--dport", "5555"); rep.Verdict != "to host stack" || rep.To.Kind != trace.KindHost {
		t.Errorf("inet -> %s:5555: %s (to %s), want to host stack\n%+v", pub, rep.Verdict, rep.To.Kind, rep.Hops)
	}

	// From the Internet straight to a VM's address: fabric trust refuses
	// it, and a real packet routed there by h1 is counted for the same.
	rep = l.traceJSON(inet, "blue/web/web1", "--proto", "udp", "--dport", "9")
	if rep.Verdict != "dropped" || !strings.HasPrefix(rep.Drop, "fabric_") || rep.DropHost != "h1" {
		t.Fatalf("inet -> web1: %s %s on %s, want a fabric_ drop on h1\n%+v", rep.Verdict, rep.Drop, rep.DropHost, rep.Hops)
	}
	l.mustIn("inet", "ip", "route", "add", web1+"/32", "via", pub)
	if d := l.dropDelta("h1", func() { l.sendUDPFrom("inet", web1, 40000, 9, 64, "outside") }, rep.Drop); d[rep.Drop] < 1 {
		t.Errorf("inet's real datagram to web1 did not move h1's %s (%v): the trace's verdict is not the datapath's", rep.Drop, d)
	}
	text, err := l.cli("trace", inet, "h1/s1", "--proto", "udp", "--sport", "53", "--dport", "10022")
	if err != nil || !strings.Contains(text, "steered by port") || !strings.Contains(text, "verdict: delivered") {
		t.Errorf("onehop trace (text) from an external to s1: %v\n%s", err, text)
	}
	t.Logf("onehop trace %s h1/s1 --proto udp --sport 53 --dport 10022:\n%s", inet, text)
	text, _ = l.cli("trace", "h1/s1", inet, "--proto", "udp", "--sport", "10001", "--dport", "9000")
	t.Logf("onehop trace h1/s1 %s --proto udp --sport 10001 --dport 9000:\n%s", inet, text)
}
