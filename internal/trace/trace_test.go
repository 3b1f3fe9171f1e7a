package trace

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/intent"
)

func TestNormalizeFillsDefaultsAndNamesWhatIsWrong(t *testing.T) {
	for _, c := range []struct {
		in      Request
		want    Request
		wantErr string
	}{
		{in: Request{From: "a/b/c", To: "10.1.1.3", Dport: 80}, want: Request{From: "a/b/c", To: "10.1.1.3", Proto: "tcp", Sport: 40000, Dport: 80, Flags: "S"}},
		{in: Request{From: "a/b/c", To: "x", Proto: "UDP", Sport: 5, Dport: 53}, want: Request{From: "a/b/c", To: "x", Proto: "udp", Sport: 5, Dport: 53}},
		{in: Request{From: "a/b/c", To: "x", Proto: "icmp"}, want: Request{From: "a/b/c", To: "x", Proto: "icmp"}},
		{in: Request{From: "a/b/c", To: "x", Dport: 1, Flags: "sa"}, want: Request{From: "a/b/c", To: "x", Proto: "tcp", Sport: 40000, Dport: 1, Flags: "SA"}},
		{in: Request{To: "x"}, wantErr: "from: empty"},
		{in: Request{From: "x"}, wantErr: "to: empty"},
		{in: Request{From: "x", To: "y", Proto: "sctp"}, wantErr: `proto "sctp"`},
		{in: Request{From: "x", To: "y"}, wantErr: "dport: required for tcp"},
		{in: Request{From: "x", To: "y", Proto: "icmp", Dport: 3}, wantErr: "an ICMP echo has no ports"},
		{in: Request{From: "x", To: "y", Proto: "udp", Dport: 3, Flags: "S"}, wantErr: "TCP flags on a UDP datagram"},
		{in: Request{From: "x", To: "y", Dport: 3, Flags: "SX"}, wantErr: `'X' is no TCP flag`},
		{in: Request{From: "x", To: "y", Dport: 3, SrcIP: "fe80::1"}, wantErr: `src-ip "fe80::1"`},
	} {
		got, err := c.in.Normalize()
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%+v: error %v, want one saying %q", c.in, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%+v: got %+v (%v), want %+v", c.in, got, err, c.want)
		}
	}
}

func TestFrameIsThePacketAsked(t *testing.T) {
	src, dst := netip.MustParseAddr("10.1.1.2"), netip.MustParseAddr("10.1.2.2")
	smac, dmac := net.HardwareAddr{2, 0, 10, 1, 1, 2}, net.HardwareAddr{2, 0, 10, 1, 1, 1}
	for _, r := range []Request{
		{Proto: "tcp", Sport: 40000, Dport: 5432, Flags: "SA"},
		{Proto: "udp", Sport: 1000, Dport: 9},
		{Proto: "icmp"},
	} {
		b, err := Frame(r, src, dst, smac, dmac)
		if err != nil {
			t.Fatal(err)
		}
		p := gopacket.NewPacket(b, layers.LayerTypeEthernet, gopacket.Default)
		if p.ErrorLayer() != nil {
			t.Fatalf("%s: %v", r.Proto, p.ErrorLayer().Error())
		}
		eth := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if eth.SrcMAC.String() != smac.String() || eth.DstMAC.String() != dmac.String() || !ip.SrcIP.Equal(src.AsSlice()) || !ip.DstIP.Equal(dst.AsSlice()) || ip.TTL != 64 {
			t.Errorf("%s: frame %v %v", r.Proto, eth, ip)
		}
		switch r.Proto {
		case "tcp":
			tcp := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
			if tcp.SrcPort != 40000 || tcp.DstPort != 5432 || !tcp.SYN || !tcp.ACK || tcp.FIN {
				t.Errorf("tcp: %v", tcp)
			}
		case "udp":
			udp := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
			if udp.SrcPort != 1000 || udp.DstPort != 9 {
				t.Errorf("udp: %v", udp)
			}
		case "icmp":
			icmp := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
			if icmp.TypeCode.Type() != layers.ICMPv4TypeEchoRequest || icmp.Id != EchoID {
				t.Errorf("icmp: %v", icmp)
			}
		}
	}
	if _, err := Frame(Request{Proto: "udp"}, netip.MustParseAddr("::1"), dst, smac, dmac); err == nil {
		t.Error("an IPv6 source was crafted")
	}
}

var testIntent = Intent{
	Farms: []intent.Farm{
		{Name: "blue", ID: 1, Peers: []string{"red"}, Rules: []intent.Rule{
			{ID: 1, From: "blue/web", To: "blue/db", Proto: "tcp", Port: 5432},
			{ID: 2, From: "blue/web", To: "blue/db"},
			{ID: 4, From: "blue/web", To: "red/api", Proto: "tcp"},
		}},
		{Name: "red", ID: 2, Peers: []string{"blue"}, Rules: []intent.Rule{
			{ID: 9, From: "blue/web", To: "red/api", Proto: "tcp", Port: 443},
		}},
	},
	Subnets: []intent.Subnet{{Farm: "blue", Name: "web", ID: 1}, {Farm: "blue", Name: "db", ID: 2}, {Farm: "red", Name: "api", ID: 1}},
	Nodes:   []intent.Node{{Name: "h1", UplinkMAC: "aa:00:00:00:00:01"}, {Name: "h2", UplinkMAC: "aa:00:00:00:00:02"}},
}

// A key a rule of one farm wrote is named by that rule; a key across farms
// (what both farms' rules allow) by every rule that covers it.
func TestVisRulesNameTheRulesBehindAKey(t *testing.T) {
	for _, c := range []struct {
		hit  VisHit
		want string
	}{
		{VisHit{VisRule: intent.VisRule{SrcFarm: 1, SrcSubnet: 1, DstFarm: 1, DstSubnet: 2, Proto: 6, Port: 5432}, Match: "port"}, "blue#1"},
		{VisHit{VisRule: intent.VisRule{SrcFarm: 1, SrcSubnet: 1, DstFarm: 1, DstSubnet: 2, Proto: 0}, Match: "any"}, "blue#2"},
		{VisHit{VisRule: intent.VisRule{SrcFarm: 1, SrcSubnet: 1, DstFarm: 2, DstSubnet: 1, Proto: 6, Port: 443}, Match: "port"}, "red#9 blue#4"}, // exact first
		{VisHit{VisRule: intent.VisRule{SrcFarm: 1, SrcSubnet: 2, DstFarm: 1, DstSubnet: 1, Proto: 6, Port: 80}}, ""},
	} {
		var got []string
		for _, r := range testIntent.VisRules(c.hit) {
			got = append(got, fmt.Sprintf("%s#%d", r.Farm, r.ID))
		}
		if strings.Join(got, " ") != c.want {
			t.Errorf("%+v: rules %v, want %q", c.hit, got, c.want)
		}
	}
}

// Each step names what decided: the firewall rule by its id (the index
// counts the direction's rules only), the next host by its uplink MAC, a
// drop by its counter's reason, a held packet as held and asked for.
func TestExplainNamesRulesHostsAndDrops(t *testing.T) {
	web1 := intent.VM{Farm: "blue", Subnet: "web", Name: "web1", Firewall: &intent.Firewall{Rules: []intent.FirewallRule{
		{ID: 3, Dir: "in", Action: "allow"}, {ID: 5, Dir: "out", Proto: "tcp", PortLo: 22, PortHi: 22, Action: "deny"},
		{ID: 8, Dir: "out", Action: "allow"},
	}}}
	from := Endpoint{Name: "blue/web/web1", IP: "10.1.1.2", Host: "h1", VM: &web1}
	to := Endpoint{Name: "blue/db/db1", IP: "10.1.2.2", Host: "h2"}
	out := []byte{0xaa, 0, 0, 0, 0, 2, 0xaa, 0, 0, 0, 0, 1}

	h := testIntent.Explain("h1", Run{Program: ProgramVif, Verdict: "drop", Drop: "firewall_out",
		Firewall: []FwHit{{Dir: "out", How: "rule", Index: 0}}}, Request{}, from, to)
	if len(h.Firewall) != 1 || h.Firewall[0].ID != 5 || !strings.Contains(strings.Join(h.Steps, "\n"), "firewall out of blue/web/web1: rule 5 denies") {
		t.Errorf("firewall drop: %+v\n%s", h.Firewall, strings.Join(h.Steps, "\n"))
	}
	h = testIntent.Explain("h1", Run{Program: ProgramVif, Verdict: "redirect", Forwards: []string{"to_fabric"}, To: 2, ToName: "uplink0", ToKind: "out", Out: out,
		Firewall:   []FwHit{{Dir: "out", How: "rule", Index: 1, Allow: true}},
		Visibility: &VisHit{VisRule: intent.VisRule{SrcFarm: 1, SrcSubnet: 1, DstFarm: 1, DstSubnet: 2, Proto: 6, Port: 5432}, Match: "port"}}, Request{}, from, to)
	if h.NextHost != "h2" || len(h.Rules) != 1 || h.Rules[0].ID != 1 || h.Firewall[0].ID != 8 {
		t.Errorf("allowed hop: next %q rules %+v firewall %+v", h.NextHost, h.Rules, h.Firewall)
	}
	rep := Report{Hops: []Hop{h}}
	rep.Finish()
	if rep.Verdict != "delivered" && rep.Verdict != "to fabric" {
		t.Errorf("verdict %q", rep.Verdict)
	}
	h = testIntent.Explain("h1", Run{Program: ProgramVif, Verdict: "to agent", Slow: "hold", Ask: true}, Request{}, from, to)
	rep = Report{Hops: []Hop{h}}
	rep.Finish()
	if rep.Verdict != "held" || !strings.Contains(strings.Join(h.Steps, "\n"), "the trace asked nothing") {
		t.Errorf("held: verdict %q\n%s", rep.Verdict, strings.Join(h.Steps, "\n"))
	}
	h = testIntent.Explain("h1", Run{Program: ProgramVif, Verdict: "drop", Drop: "spoofed_ip"}, Request{}, from, to)
	rep = Report{Hops: []Hop{h}}
	rep.Finish()
	if rep.Verdict != "dropped" || rep.Drop != "spoofed_ip" || rep.DropHost != "h1" || !strings.Contains(h.Steps[1], "anti-spoofing: refused (spoofed_ip)") {
		t.Errorf("spoofed: %+v\n%s", rep, strings.Join(h.Steps, "\n"))
	}
}

// The CLI's FROM, TO and flags (Request.Normalize, which `onehop trace`
// runs before it asks): never a panic; an error names its field first, and
// what it accepts is a request Frame can craft.
func FuzzTraceRequestNormalize(f *testing.F) {
	f.Add("blue/web/web1", "blue/db/db1", "tcp", uint16(0), uint16(5432), "", "")
	f.Add("h1/s1", "192.0.2.7", "udp", uint16(10001), uint16(53), "", "")
	f.Add("192.0.2.7", "h1/s1", "ICMP", uint16(0), uint16(0), "", "")
	f.Add("", "x", "sctp", uint16(1), uint16(1), "SX", "10.1.1.300")
	f.Add("a", "b", "icmp", uint16(1), uint16(0), "S", "")
	f.Add("a", "b", "udp", uint16(0), uint16(9), "A", "::1")
	f.Fuzz(func(t *testing.T, from, to, proto string, sport, dport uint16, flags, srcIP string) {
		r, err := Request{From: from, To: to, Proto: proto, Sport: sport, Dport: dport, Flags: flags, SrcIP: srcIP}.Normalize()
		if err != nil {
			var bad *Invalid
			if !errors.As(err, &bad) || !slices.Contains([]string{"from", "to", "src-ip", "proto", "sport", "dport", "flags"}, bad.Field) ||
				!strings.HasPrefix(bad.Msg, bad.Field) {
				t.Fatalf("Normalize(%q, %q, %q, %d, %d, %q, %q): %v names no field", from, to, proto, sport, dport, flags, srcIP, err)
			}
			return
		}
		src, dst := netip.MustParseAddr("10.1.1.2"), netip.MustParseAddr("10.1.2.2")
		if _, err := Frame(r, src, dst, net.HardwareAddr{2, 0, 0, 0, 0, 1}, net.HardwareAddr{2, 0, 0, 0, 0, 2}); err != nil {
			t.Fatalf("Normalize accepted %+v, which Frame refuses: %v", r, err)
		}
		if r.Proto != "icmp" && r.Dport == 0 {
			t.Fatalf("Normalize accepted %+v without a destination port", r)
		}
	})
}
