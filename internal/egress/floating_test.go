package egress

import (
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
)

// Floating addresses (bpf/lib/floating.h): a's floating address is steered
// whole to a and a leaves with it, ports untouched; b, with a firewall,
// is reached on its floating address only where its rules let in, and
// its own flows' replies come back.

var (
	floatA   = netip.MustParseAddr("192.168.0.50")
	floatB   = netip.MustParseAddr("192.168.0.51")
	floatFar = netip.MustParseAddr("192.168.0.52") // a VM's on another host: no entry here
)

func floatingDesired() intent.Desired {
	d := egressDesired()
	d.Local[0].Egress = nil // a: no egress in its farm, a floating address only
	d.Local[0].Floating = floatA.String()
	d.Local[1].Floating = floatB.String() // b: a slice too, and a firewall
	d.Local[1].Firewall = &intent.Firewall{DefaultIn: "deny", DefaultOut: "allow",
		Rules: []intent.FirewallRule{{Dir: "in", Proto: "tcp", PortLo: 80, PortHi: 80, Action: "allow"}}}
	return d
}

func TestPrivilegedFloatingAddressIsTheVMsWhole(t *testing.T) {
	h := loadEgressHost(t, floatingDesired())
	vif, up := h.k.VifProgram(), h.k.UplinkProgram()
	tcp, udp, icmp, gre := layers.IPProtocolTCP, layers.IPProtocolUDP, layers.IPProtocolICMPv4, layers.IPProtocolGRE

	from := func(f bpftest.Frame) bpftest.Frame { // inet, to a floating address
		f.Src, f.Dst, f.Saddr = inetMAC, h1MAC, inet
		return f
	}
	into := func(vm netip.Addr, f bpftest.Frame) []byte { // as it enters vm: its own address, from its gateway, one hop taken
		f.Src, f.Dst, f.Saddr, f.Daddr, f.TTL = vmac(gw), vmac(vm), inet, vm, 63
		return f.Bytes(t)
	}
	wire := func(fl netip.Addr, f bpftest.Frame) []byte { // a VM's packet as it leaves: the floating address, one hop taken
		f.Src, f.Dst, f.Saddr, f.TTL = vmac(vmA), vmac(gw), fl, 63
		return f.Bytes(t)
	}
	peer := func(name string, in bpftest.Frame, out []byte, to uint32, c bpftest.Counters) bpftest.Row {
		return bpftest.Row{Name: name, Prog: up, In: from(in).Bytes(t), Out: out, Verdict: bpftest.ActRedirect, To: to, Kind: bpftest.RedirectPeer, Counters: c}
	}
	inA := bpftest.Counters{"forward egress_in": 1, "a in": 1}
	inB := bpftest.Counters{"forward egress_in": 1, "b in": 1}
	outA := bpftest.Counters{"forward egress_out": 1, "a out": 1}
	quote := &bpftest.Frame{Saddr: floatA, Daddr: inet, Proto: udp, Sport: 5000, Dport: 53, TTL: 63}
	quoteA := *quote
	quoteA.Saddr = vmA
	rows := []bpftest.Row{
		peer("tcp to a's floating address enters a, every port as it was", bpftest.Frame{Daddr: floatA, Proto: tcp, Sport: 5555, Dport: 22},
			into(vmA, bpftest.Frame{Proto: tcp, Sport: 5555, Dport: 22}), 1, inA),
		peer("udp too", bpftest.Frame{Daddr: floatA, Proto: udp, Sport: 5555, Dport: 9999},
			into(vmA, bpftest.Frame{Proto: udp, Sport: 5555, Dport: 9999}), 1, inA),
		peer("an echo request keeps its id", bpftest.Frame{Daddr: floatA, Proto: icmp, ICMPType: 8, ICMPID: 4242},
			into(vmA, bpftest.Frame{Proto: icmp, ICMPType: 8, ICMPID: 4242}), 1, inA),
		peer("and any other protocol (GRE) enters whole", bpftest.Frame{Daddr: floatA, Proto: gre},
			into(vmA, bpftest.Frame{Proto: gre}), 1, inA),
		peer("an error quoting a's datagram from its floating address reaches a, quoting a's own address", bpftest.Frame{Daddr: floatA, Proto: icmp, ICMPType: 3, ICMPCode: 3, Quote: quote},
			into(vmA, bpftest.Frame{Proto: icmp, ICMPType: 3, ICMPCode: 3, Quote: &quoteA}), 1, inA),
		{Name: "an error quoting someone else's packet enters nowhere", Prog: up,
			In:      from(bpftest.Frame{Daddr: floatA, Proto: icmp, ICMPType: 3, ICMPCode: 3, Quote: &bpftest.Frame{Saddr: hostAddr, Daddr: inet, Proto: udp, Sport: 1, Dport: 53}}).Bytes(t),
			Verdict: bpftest.ActShot, Counters: bpftest.Counters{"drop firewall_in": 1}},
		{Name: "the floating address of a VM on another host (no entry here) is the host stack's", Prog: up,
			In: from(bpftest.Frame{Daddr: floatFar, Proto: tcp, Sport: 5555, Dport: 80}).Bytes(t), Verdict: bpftest.ActOK, Counters: bpftest.Counters{"forward host_stack": 1}},
		{Name: "a's tcp leaves with its floating address, ports kept, no slice port claimed", Prog: vif,
			In: fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: tcp, Sport: 40000, Dport: 80}).Bytes(t), Out: wire(floatA, bpftest.Frame{Daddr: inet, Proto: tcp, Sport: 40000, Dport: 80}),
			Verdict: bpftest.ActRedirect, To: uplinkIfindex, Kind: bpftest.RedirectNeigh, Counters: outA},
		{Name: "udp, ports kept", Prog: vif,
			In: fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: udp, Sport: 5000, Dport: 53}).Bytes(t), Out: wire(floatA, bpftest.Frame{Daddr: inet, Proto: udp, Sport: 5000, Dport: 53}),
			Verdict: bpftest.ActRedirect, To: uplinkIfindex, Kind: bpftest.RedirectNeigh, Counters: outA},
		{Name: "an echo request, id kept", Prog: vif,
			In: fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: icmp, ICMPType: 8, ICMPID: 77}).Bytes(t), Out: wire(floatA, bpftest.Frame{Daddr: inet, Proto: icmp, ICMPType: 8, ICMPID: 77}),
			Verdict: bpftest.ActRedirect, To: uplinkIfindex, Kind: bpftest.RedirectNeigh, Counters: outA},
		{Name: "an error of a's own (port unreachable to inet) leaves quoting the floating address", Prog: vif,
			In:      fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: icmp, ICMPType: 3, ICMPCode: 3, Quote: &bpftest.Frame{Saddr: inet, Daddr: vmA, Proto: udp, Sport: 9, Dport: 9}}).Bytes(t),
			Out:     wire(floatA, bpftest.Frame{Daddr: inet, Proto: icmp, ICMPType: 3, ICMPCode: 3, Quote: &bpftest.Frame{Saddr: inet, Daddr: floatA, Proto: udp, Sport: 9, Dport: 9}}),
			Verdict: bpftest.ActRedirect, To: uplinkIfindex, Kind: bpftest.RedirectNeigh, Counters: outA},
		{Name: "a's destination list still holds: the host's own address is not reached", Prog: vif,
			In: fromVM(vmA, bpftest.Frame{Daddr: hostAddr, Proto: tcp, Sport: 1, Dport: 22}).Bytes(t), Verdict: bpftest.ActShot, Counters: bpftest.Counters{"drop egress_to_host": 1}},
		{Name: "an ARP question for a's floating address is answered with the uplink's MAC", Prog: up,
			In:      bpftest.Frame{Src: inetMAC, Dst: bpftest.MustMAC("ff:ff:ff:ff:ff:ff"), ARPOp: 1, Saddr: inet, Daddr: floatA}.Bytes(t),
			Out:     bpftest.Frame{Src: h1MAC, Dst: inetMAC, ARPOp: 2, ARPSHA: h1MAC, ARPTHA: inetMAC, Saddr: floatA, Daddr: inet}.Bytes(t),
			Verdict: bpftest.ActRedirect, To: uplinkIfindex, Kind: bpftest.RedirectOut, Counters: bpftest.Counters{"forward arp_answered": 1}},
		{Name: "one for another host's floating address is the stack's", Prog: up,
			In:      bpftest.Frame{Src: inetMAC, Dst: bpftest.MustMAC("ff:ff:ff:ff:ff:ff"), ARPOp: 1, Saddr: inet, Daddr: floatFar}.Bytes(t),
			Verdict: bpftest.ActOK, Counters: bpftest.Counters{"forward host_stack": 1}},
	}
	bpftest.RunTable(t, h.counters, rows)

	// b, on lo now, has a firewall: in on tcp 80 only; its own flows' replies
	// pass.
	h.onLo(t, "b")
	outB := bpftest.Counters{"forward egress_out": 1, "b out": 1}
	rows = []bpftest.Row{
		peer("tcp to b's port 80 passes its firewall", bpftest.Frame{Daddr: floatB, Proto: tcp, Sport: 5555, Dport: 80},
			into(vmB, bpftest.Frame{Proto: tcp, Sport: 5555, Dport: 80}), 1, inB),
		{Name: "its port 22 does not", Prog: up, In: from(bpftest.Frame{Daddr: floatB, Proto: tcp, Sport: 5555, Dport: 22}).Bytes(t),
			Verdict: bpftest.ActShot, Counters: bpftest.Counters{"drop firewall_in": 1}},
		{Name: "b's flow out to inet:443 leaves with b's floating address, not its slice", Prog: vif,
			In:      fromVM(vmB, bpftest.Frame{Daddr: inet, Proto: tcp, Sport: 41000, Dport: 443}).Bytes(t),
			Out:     bpftest.Frame{Src: vmac(vmB), Dst: vmac(gw), Saddr: floatB, Daddr: inet, Proto: tcp, Sport: 41000, Dport: 443, TTL: 63}.Bytes(t),
			Verdict: bpftest.ActRedirect, To: uplinkIfindex, Kind: bpftest.RedirectNeigh, Counters: outB},
		peer("and its reply comes back in, though no rule lets port 41000 in", bpftest.Frame{Daddr: floatB, Proto: tcp, Sport: 443, Dport: 41000},
			into(vmB, bpftest.Frame{Proto: tcp, Sport: 443, Dport: 41000}), 1, inB),
		{Name: "an error about a flow b never opened does not", Prog: up,
			In:      from(bpftest.Frame{Daddr: floatB, Proto: icmp, ICMPType: 3, ICMPCode: 3, Quote: &bpftest.Frame{Saddr: floatB, Daddr: inet, Proto: udp, Sport: 7, Dport: 7}}).Bytes(t),
			Verdict: bpftest.ActShot, Counters: bpftest.Counters{"drop firewall_in": 1}},
		peer("one about b's flow does, quoting b's own address", bpftest.Frame{Daddr: floatB, Proto: icmp, ICMPType: 3, ICMPCode: 4, Quote: &bpftest.Frame{Saddr: floatB, Daddr: inet, Proto: tcp, Sport: 41000, Dport: 443, TTL: 63}},
			into(vmB, bpftest.Frame{Proto: icmp, ICMPType: 3, ICMPCode: 4, Quote: &bpftest.Frame{Saddr: vmB, Daddr: inet, Proto: tcp, Sport: 41000, Dport: 443, TTL: 63}}), 1, inB),
	}
	bpftest.RunTable(t, h.counters, rows)

	// Detached: the address is the host stack's again, ARP falls silent,
	// and a (no egress in its farm) reaches nothing outside.
	d := floatingDesired()
	d.Local[0].Floating = ""
	h.sync(t, d)
	h.onLo(t, "a")
	bpftest.RunTable(t, h.counters, []bpftest.Row{
		{Name: "after a detach, a's old floating address is the stack's", Prog: up,
			In: from(bpftest.Frame{Daddr: floatA, Proto: tcp, Sport: 5555, Dport: 22}).Bytes(t), Verdict: bpftest.ActOK, Counters: bpftest.Counters{"forward host_stack": 1}},
		{Name: "and no ARP answer for it", Prog: up,
			In:      bpftest.Frame{Src: inetMAC, Dst: bpftest.MustMAC("ff:ff:ff:ff:ff:ff"), ARPOp: 1, Saddr: inet, Daddr: floatA}.Bytes(t),
			Verdict: bpftest.ActOK, Counters: bpftest.Counters{"forward host_stack": 1}},
		{Name: "and a reaches nothing outside", Prog: vif,
			In: fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: tcp, Sport: 40000, Dport: 80}).Bytes(t), Verdict: bpftest.ActShot, Counters: bpftest.Counters{"drop no_route": 1}},
	})

	// Attached again (as after a move here): announced once, when it
	// arrives; a pass that changes nothing announces nothing.
	var announced []netip.Addr
	h.f.WithAnnounce(func(a netip.Addr) { announced = append(announced, a) })
	h.sync(t, floatingDesired())
	h.sync(t, floatingDesired())
	if len(announced) != 1 || announced[0] != floatA {
		t.Errorf("announced %v, want a's floating address %s once", announced, floatA)
	}
}

func TestFloatingCompileRefusesAddressesNamingTheVM(t *testing.T) {
	up := []feature.Uplink{{Index: 0, Name: "up0", Ifindex: uplinkIfindex, MAC: h1MAC, Addr: hostAddr, Bits: 24}}
	for _, tc := range []struct{ name, addr, want string }{
		{"not an address", "nope", `vm blue/web/a: floating address "nope": want an IPv4 address`},
		{"IPv6", "2001:db8::1", `vm blue/web/a: floating address "2001:db8::1": want an IPv4 address`},
		{"the host's own", hostAddr.String(), "vm blue/web/a: floating address 192.168.0.1 is the host's own uplink address"},
		{"in the tenant space", "10.9.9.9", "vm blue/web/a: floating address 10.9.9.9 is in the tenant space 10.0.0.0/8"},
		{"held twice", floatB.String(), "vm blue/web/b: floating address 192.168.0.51 is vm blue/web/a's too"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := floatingDesired()
			d.Local[0].Floating = tc.addr
			_, err := Compile(feature.Node{Name: "h1", Desired: d, Uplinks: up})
			if err == nil || err.Error() != tc.want {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	p, err := Compile(feature.Node{Name: "h1", Desired: floatingDesired(), Uplinks: up})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Sizes()[MapAddrs]; got != 3 {
		t.Errorf("egress_addrs holds %d entries, want 3 (the host's and two floating)", got)
	}
	if got := p.Sizes()[MapPorts]; got != 4 {
		t.Errorf("egress_ports holds %d, want 4 (b's slice only; a has none)", got)
	}
}
