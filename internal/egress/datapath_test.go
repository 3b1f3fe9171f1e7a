package egress

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ipam"
	"github.com/onehop/onehop/internal/testenv"
)

// BPF_PROG_RUN tables: the VM program translating a VM's packets out to a
// port of its slice, and the uplink program steering replies (and ICMP
// errors, and fragments) back by that port. The maps are seeded by the
// router's and this feature's own compilers, as the agent does.

var (
	h1MAC   = bpftest.MustMAC("aa:00:00:00:00:01")
	inetMAC = bpftest.MustMAC("aa:00:00:00:00:99")

	hostAddr = netip.MustParseAddr("192.168.0.1")   // h1's uplink address
	inet     = netip.MustParseAddr("192.168.0.200") // outside, allowed
	far      = netip.MustParseAddr("198.51.100.9")  // outside, not on the list
	vmA      = netip.MustParseAddr("10.1.1.2")      // on lo (ifindex 1): the sender
	vmB      = netip.MustParseAddr("10.1.1.3")
	gw       = netip.MustParseAddr("10.1.1.1")
)

const (
	uplinkIfindex = 7
	vmBIfindex    = 42
	sliceALo      = 2000 // a's slice: 2000-2003
	sliceBLo      = 3000 // b's slice: 3000-3003
)

func vmac(a netip.Addr) net.HardwareAddr { return ipam.VirtualMAC(a) }

func egressDesired() intent.Desired {
	vm := func(name string, ip netip.Addr, lo uint16) intent.LocalEndpoint {
		return intent.LocalEndpoint{Name: "blue/web/" + name, IP: ip.String(), MAC: vmac(ip).String(), Interface: "vif-" + name,
			Egress: &intent.VMEgress{Slice: intent.Lease{Lo: lo, Hi: lo + 3}, To: []string{"192.168.0.0/24"}}}
	}
	return intent.Desired{Node: "h1", VMNet: "10.0.0.0/8", Local: []intent.LocalEndpoint{vm("a", vmA, sliceALo), vm("b", vmB, sliceBLo)}}
}

type testHost struct {
	k *datapath.Kernel
	f *Feature
	d intent.Desired
}

// onLo puts vm's vif on lo (ifindex 1), the only device BPF_PROG_RUN
// injects from, and the other VM's on vmBIfindex.
func (h *testHost) onLo(t *testing.T, vm string) {
	t.Helper()
	ifindexOf := func(n string) (int, error) {
		switch n {
		case "vif-" + vm:
			return 1, nil
		case "vif-a", "vif-b":
			return vmBIfindex, nil
		}
		return 0, errors.New("no such link")
	}
	e, missing, err := datapath.Compile(h.d, datapath.Uplink{Ifindex: uplinkIfindex, MAC: h1MAC}, ifindexOf)
	if err != nil || len(missing) != 0 {
		t.Fatalf("compile: %v (missing %v)", err, missing)
	}
	e.Attach = nil
	if err := h.k.Apply(e, ""); err != nil {
		t.Fatalf("apply: %v", err)
	}
}

func loadEgressHost(t *testing.T, d intent.Desired) *testHost {
	t.Helper()
	testenv.RequireRoot(t, "BPF_PROG_RUN")
	k, err := datapath.OpenTestObjects()
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("load datapath: %v\nverifier log:\n%+v", err, ve)
		}
		t.Fatalf("load datapath: %v", err)
	}
	t.Cleanup(func() { k.Close() })
	h := &testHost{k: k, f: New(k), d: d}
	h.onLo(t, "a")
	h.sync(t, d)
	return h
}

func (h *testHost) sync(t *testing.T, d intent.Desired) {
	t.Helper()
	p, err := Compile(feature.Node{Name: "h1", Desired: d,
		Uplinks: []feature.Uplink{{Index: 0, Name: "up0", Ifindex: uplinkIfindex, MAC: h1MAC, Addr: hostAddr, Bits: 24}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := feature.CheckFit("egress", p.Sizes(), h.k.Capacity); err != nil {
		t.Fatal(err)
	}
	if err := h.f.Sync(p); err != nil {
		t.Fatalf("sync: %v", err)
	}
	bits := uint32(0)
	if p.InUse() {
		bits = datapath.FeatureEgress
	}
	if err := h.k.SetFeatures(bits); err != nil {
		t.Fatal(err)
	}
}

// counters: the node's drop and forward counters and each VM's egress
// counters ("a refused", "b flows").
func (h *testHost) counters(t testing.TB) bpftest.Counters {
	t.Helper()
	c, err := h.k.Counters()
	if err != nil {
		t.Fatal(err)
	}
	out := bpftest.Counters{}.Add("drop", c.Drops).Add("forward", c.Forwards)
	st, err := h.f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		n := s.Name[len("blue/web/"):]
		out[n+" flows"], out[n+" refused"], out[n+" not_allowed"] = s.Flows, s.Refused, s.NotAllowed
		out[n+" out"], out[n+" in"] = s.PacketsOut, s.PacketsIn
	}
	for k, v := range out {
		if v == 0 {
			delete(out, k)
		}
	}
	return out
}

func fromVM(src netip.Addr, f bpftest.Frame) bpftest.Frame {
	f.Src, f.Dst, f.Saddr = vmac(src), vmac(gw), src
	return f
}

// ports reads the source (or destination) port, or echo id, of an IPv4
// frame without options.
func l4Word(out []byte, off int) uint16 {
	if len(out) < 14+20+off+2 {
		return 0
	}
	return binary.BigEndian.Uint16(out[14+20+off:])
}

// translated checks that the frame out is want with its source port (or
// echo id, at off) one of [lo, lo+3], whatever the hash picked, and keeps
// the port it found in *got.
func translated(want bpftest.Frame, lo uint16, off int, isID bool, got *uint16) func(t *testing.T, out []byte) {
	return func(t *testing.T, out []byte) {
		t.Helper()
		p := l4Word(out, off)
		if p < lo || p > lo+3 {
			t.Fatalf("left with port/id %d, want one of its slice %d-%d", p, lo, lo+3)
		}
		if isID {
			want.ICMPID = p
		} else {
			want.Sport = p
		}
		if b := want.Bytes(t); !bytes.Equal(out, b) {
			t.Errorf("output frame\n got %x\nwant %x", out, b)
		}
		if *got != 0 && *got != p {
			t.Errorf("the flow left by port %d before, now by %d", *got, p)
		}
		*got = p
	}
}

func TestPrivilegedEgressTranslatesWithinEachVMsOwnSlice(t *testing.T) {
	h := loadEgressHost(t, egressDesired())
	vif, up := h.k.VifProgram(), h.k.UplinkProgram()
	tcp, udp, icmp := layers.IPProtocolTCP, layers.IPProtocolUDP, layers.IPProtocolICMPv4

	flow := func(sport uint16) bpftest.Frame {
		return fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: tcp, Sport: sport, Dport: 80})
	}
	wire := func(f bpftest.Frame) bpftest.Frame { // as it leaves: the host's address, one hop taken
		f.Src, f.Dst, f.Saddr, f.TTL = vmac(vmA), vmac(gw), hostAddr, 63
		return f
	}
	var p1, p2, p3, p4, pb, pICMP, pUDP, pFrag uint16
	neigh := func(name string, in bpftest.Frame, check func(*testing.T, []byte), c bpftest.Counters) bpftest.Row {
		return bpftest.Row{Name: name, Prog: vif, In: in.Bytes(t), Verdict: bpftest.ActRedirect, To: uplinkIfindex,
			Kind: bpftest.RedirectNeigh, Check: check, Counters: c}
	}
	out := func(vm string) bpftest.Counters {
		return bpftest.Counters{"forward egress_out": 1, vm + " out": 1}
	}
	opened := func(vm string) bpftest.Counters {
		c := out(vm)
		c[vm+" flows"] = 1
		return c
	}
	rows := []bpftest.Row{
		neigh("a's first tcp flow leaves with the host's address and a port of a's slice", flow(40000), translated(wire(flow(40000)), sliceALo, 0, false, &p1), opened("a")),
		neigh("its next packet keeps the port", flow(40000), translated(wire(flow(40000)), sliceALo, 0, false, &p1), out("a")),
		neigh("a second flow takes another port", flow(40001), translated(wire(flow(40001)), sliceALo, 0, false, &p2), opened("a")),
		neigh("a third", flow(40002), translated(wire(flow(40002)), sliceALo, 0, false, &p3), opened("a")),
		neigh("a fourth fills a's slice of four", flow(40003), translated(wire(flow(40003)), sliceALo, 0, false, &p4), opened("a")),
		{Name: "a fifth flow is refused, counted for a", Prog: vif, In: flow(40004).Bytes(t), Verdict: bpftest.ActShot,
			Counters: bpftest.Counters{"drop egress_slice_full": 1, "a refused": 1}},
		neigh("an echo request takes an echo id of a's slice (a row of its own)", fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: icmp, ICMPType: 8, ICMPID: 77}),
			translated(wire(fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: icmp, ICMPType: 8, ICMPID: 77})), sliceALo, 4, true, &pICMP), opened("a")),
		neigh("a udp flow to inet:53", fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: udp, Sport: 5000, Dport: 53}),
			translated(wire(fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: udp, Sport: 5000, Dport: 53})), sliceALo, 0, false, &pUDP), opened("a")),
		{Name: "a destination off the farm's list is refused", Prog: vif, In: fromVM(vmA, bpftest.Frame{Daddr: far, Proto: tcp, Sport: 1, Dport: 80}).Bytes(t),
			Verdict: bpftest.ActShot, Counters: bpftest.Counters{"drop egress_not_allowed": 1, "a not_allowed": 1}},
		{Name: "the host's own address is not reached through the translation", Prog: vif, In: fromVM(vmA, bpftest.Frame{Daddr: hostAddr, Proto: tcp, Sport: 1, Dport: 22}).Bytes(t),
			Verdict: bpftest.ActShot, Counters: bpftest.Counters{"drop egress_to_host": 1}},
		{Name: "GRE is refused", Prog: vif, In: fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: layers.IPProtocolGRE}).Bytes(t),
			Verdict: bpftest.ActShot, Counters: bpftest.Counters{"drop egress_proto": 1}},
	}
	bpftest.RunTable(t, h.counters, rows)

	// b, on lo now: its slice is untouched by a's.
	h.onLo(t, "b")
	bpftest.RunTable(t, h.counters, []bpftest.Row{
		neigh("b's flow to the same place still opens, in b's slice", fromVM(vmB, bpftest.Frame{Daddr: inet, Proto: tcp, Sport: 40004, Dport: 80}),
			translated(bpftest.Frame{Src: vmac(vmB), Dst: vmac(gw), Saddr: hostAddr, Daddr: inet, Proto: tcp, Sport: 40004, Dport: 80, TTL: 63}, sliceBLo, 0, false, &pb), opened("b")),
	})
	h.onLo(t, "a")

	reply := func(dport uint16, f bpftest.Frame) bpftest.Frame {
		f.Src, f.Dst, f.Saddr, f.Daddr, f.Dport = inetMAC, h1MAC, inet, hostAddr, dport
		return f
	}
	inA := func(f bpftest.Frame) []byte { // delivered into a: its own address, from its gateway, one hop taken
		f.Src, f.Dst, f.Daddr, f.TTL = vmac(gw), vmac(vmA), vmA, 63
		return f.Bytes(t)
	}
	back := bpftest.Counters{"forward egress_in": 1, "a in": 1}
	rows = []bpftest.Row{
		{Name: "inet's reply to a's first port is steered into a, un-translated", Prog: up,
			In:  reply(p1, bpftest.Frame{Proto: tcp, Sport: 80}).Bytes(t),
			Out: inA(bpftest.Frame{Saddr: inet, Proto: tcp, Sport: 80, Dport: 40000}), Verdict: bpftest.ActRedirect, To: 1, Kind: bpftest.RedirectPeer, Counters: back},
		{Name: "the fourth port reaches a's fourth flow", Prog: up,
			In:  reply(p4, bpftest.Frame{Proto: tcp, Sport: 80}).Bytes(t),
			Out: inA(bpftest.Frame{Saddr: inet, Proto: tcp, Sport: 80, Dport: 40003}), Verdict: bpftest.ActRedirect, To: 1, Kind: bpftest.RedirectPeer, Counters: back},
		{Name: "the same port from another remote port is the host's, not a's", Prog: up,
			In: reply(p1, bpftest.Frame{Proto: tcp, Sport: 81}).Bytes(t), Verdict: bpftest.ActOK, Counters: bpftest.Counters{"forward host_stack": 1}},
		{Name: "a port of no slice is the host's own", Prog: up,
			In: reply(22, bpftest.Frame{Proto: tcp, Sport: 80}).Bytes(t), Verdict: bpftest.ActOK, Counters: bpftest.Counters{"forward host_stack": 1}},
		{Name: "b's port reaches b", Prog: up,
			In:      reply(pb, bpftest.Frame{Proto: tcp, Sport: 80}).Bytes(t),
			Out:     bpftest.Frame{Src: vmac(gw), Dst: vmac(vmB), Saddr: inet, Daddr: vmB, Proto: tcp, Sport: 80, Dport: 40004, TTL: 63}.Bytes(t),
			Verdict: bpftest.ActRedirect, To: vmBIfindex, Kind: bpftest.RedirectPeer, Counters: bpftest.Counters{"forward egress_in": 1, "b in": 1}},
		{Name: "an echo reply gets a's own id back", Prog: up,
			In:  bpftest.Frame{Src: inetMAC, Dst: h1MAC, Saddr: inet, Daddr: hostAddr, Proto: icmp, ICMPType: 0, ICMPID: pICMP}.Bytes(t),
			Out: inA(bpftest.Frame{Saddr: inet, Proto: icmp, ICMPType: 0, ICMPID: 77}), Verdict: bpftest.ActRedirect, To: 1, Kind: bpftest.RedirectPeer, Counters: back},
		{Name: "port unreachable about a's udp flow reaches a, quoting a's own address and port", Prog: up,
			In: bpftest.Frame{Src: inetMAC, Dst: h1MAC, Saddr: inet, Daddr: hostAddr, Proto: icmp, ICMPType: 3, ICMPCode: 3,
				Quote: &bpftest.Frame{Saddr: hostAddr, Daddr: inet, Proto: udp, Sport: pUDP, Dport: 53, TTL: 63}}.Bytes(t),
			Out: inA(bpftest.Frame{Saddr: inet, Proto: icmp, ICMPType: 3, ICMPCode: 3,
				Quote: &bpftest.Frame{Saddr: vmA, Daddr: inet, Proto: udp, Sport: 5000, Dport: 53, TTL: 63}}),
			Verdict: bpftest.ActRedirect, To: 1, Kind: bpftest.RedirectPeer, Counters: back},
		{Name: "time exceeded about a's echo request reaches a, quoting a's own id, its checksum patched to match", Prog: up,
			In: bpftest.Frame{Src: inetMAC, Dst: h1MAC, Saddr: inet, Daddr: hostAddr, Proto: icmp, ICMPType: 11,
				Quote: &bpftest.Frame{Saddr: hostAddr, Daddr: inet, Proto: icmp, ICMPType: 8, ICMPID: pICMP, TTL: 63}}.Bytes(t),
			Out: inA(bpftest.Frame{Saddr: inet, Proto: icmp, ICMPType: 11,
				Quote: &bpftest.Frame{Saddr: vmA, Daddr: inet, Proto: icmp, ICMPType: 8, ICMPID: 77, TTL: 63}}),
			Verdict: bpftest.ActRedirect, To: 1, Kind: bpftest.RedirectPeer, Counters: back},
		{Name: "a's packet out with TTL 1 is answered by its gateway with time exceeded, before a port is sought in its full slice", Prog: vif,
			In: fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: tcp, Sport: 40011, Dport: 80, TTL: 1}).Bytes(t), Out: timeExceeded(t, fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: tcp, Sport: 40011, Dport: 80, TTL: 1})),
			Verdict: bpftest.ActRedirect, To: 1, Kind: bpftest.RedirectOut, Counters: bpftest.Counters{"forward gateway_reply": 1}},
		{Name: "an error quoting a flow of the host's own is the host's", Prog: up,
			In: bpftest.Frame{Src: inetMAC, Dst: h1MAC, Saddr: inet, Daddr: hostAddr, Proto: icmp, ICMPType: 3, ICMPCode: 3,
				Quote: &bpftest.Frame{Saddr: hostAddr, Daddr: inet, Proto: udp, Sport: 40000, Dport: 53}}.Bytes(t),
			Verdict: bpftest.ActOK, Counters: bpftest.Counters{"forward host_stack": 1}},
	}
	bpftest.RunTable(t, h.counters, rows)

	// Fragments: a's large datagram out, and inet's large reply back.
	first := fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: udp, Sport: 6000, Dport: 9000, IPID: 900, MoreFragments: true})
	later := fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: udp, IPID: 900, FragOffset: 185})
	stray := fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: udp, IPID: 901, FragOffset: 185})
	wireLater := later
	wireLater.Saddr, wireLater.TTL = hostAddr, 63
	rows = []bpftest.Row{
		neigh("a's first fragment is translated like any packet", first, translated(wire(first), sliceALo, 0, false, &pFrag), opened("a")),
		{Name: "its later fragment follows with the host's address", Prog: vif, In: later.Bytes(t), Out: headerOnly(t, wireLater, later),
			Verdict: bpftest.ActRedirect, To: uplinkIfindex, Kind: bpftest.RedirectNeigh, Counters: out("a")},
		{Name: "a later fragment whose first fragment a never sent is dropped", Prog: vif, In: stray.Bytes(t),
			Verdict: bpftest.ActShot, Counters: bpftest.Counters{"drop frag_no_first": 1}},
	}
	bpftest.RunTable(t, h.counters, rows)
	rfirst := bpftest.Frame{Src: inetMAC, Dst: h1MAC, Saddr: inet, Daddr: hostAddr, Proto: udp, Sport: 9000, Dport: pFrag, IPID: 500, MoreFragments: true}
	rlater := bpftest.Frame{Src: inetMAC, Dst: h1MAC, Saddr: inet, Daddr: hostAddr, Proto: udp, IPID: 500, FragOffset: 185}
	rstray := rlater
	rstray.IPID = 501
	rows = []bpftest.Row{
		{Name: "inet's first fragment back reaches a", Prog: up, In: rfirst.Bytes(t),
			Out:     inA(bpftest.Frame{Saddr: inet, Proto: udp, Sport: 9000, Dport: 6000, IPID: 500, MoreFragments: true}),
			Verdict: bpftest.ActRedirect, To: 1, Kind: bpftest.RedirectPeer, Counters: back},
		{Name: "and its later fragment follows it", Prog: up, In: rlater.Bytes(t),
			Out:     headerOnly(t, bpftest.Frame{Src: vmac(gw), Dst: vmac(vmA), Saddr: inet, Daddr: vmA, Proto: udp, IPID: 500, FragOffset: 185, TTL: 63}, rlater),
			Verdict: bpftest.ActRedirect, To: 1, Kind: bpftest.RedirectPeer, Counters: back},
		{Name: "a later fragment of no translated datagram is the host's", Prog: up, In: rstray.Bytes(t),
			Verdict: bpftest.ActOK, Counters: bpftest.Counters{"forward host_stack": 1}},
	}
	bpftest.RunTable(t, h.counters, rows)

	// Distinct ports for distinct flows, all in a's slice.
	seen := map[uint16]bool{}
	for _, p := range []uint16{p1, p2, p3, p4} {
		if seen[p] {
			t.Errorf("two of a's flows share port %d (ports %d %d %d %d)", p, p1, p2, p3, p4)
		}
		seen[p] = true
	}
}

// headerOnly is want's Ethernet and IPv4 headers followed by in's payload:
// a later fragment's bytes are payload, which no translation touches (the
// frame builder writes an L4 header into them).
func headerOnly(t *testing.T, want, in bpftest.Frame) []byte {
	w, i := want.Bytes(t), in.Bytes(t)
	return append(w[:14+20:14+20], i[14+20:]...)
}

func TestPrivilegedEgressOffReachesNothingOutside(t *testing.T) {
	d := egressDesired()
	d.Local[0].Egress = nil // a's farm has no egress; b's has
	h := loadEgressHost(t, d)
	bpftest.RunTable(t, h.counters, []bpftest.Row{
		{Name: "a VM without a slice is refused as before (no route)", Prog: h.k.VifProgram(),
			In:      fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: layers.IPProtocolTCP, Sport: 1, Dport: 80}).Bytes(t),
			Verdict: bpftest.ActShot, Counters: bpftest.Counters{"drop no_route": 1}},
		{Name: "a packet to a port of nobody's slice goes to the host", Prog: h.k.UplinkProgram(),
			In:      bpftest.Frame{Src: inetMAC, Dst: h1MAC, Saddr: inet, Daddr: hostAddr, Proto: layers.IPProtocolTCP, Sport: 80, Dport: sliceALo}.Bytes(t),
			Verdict: bpftest.ActOK, Counters: bpftest.Counters{"forward host_stack": 1}},
		{Name: "and to a port of b's slice with no translation, to the host too (a host service may listen there)", Prog: h.k.UplinkProgram(),
			In:      bpftest.Frame{Src: inetMAC, Dst: h1MAC, Saddr: inet, Daddr: hostAddr, Proto: layers.IPProtocolTCP, Sport: 80, Dport: sliceBLo}.Bytes(t),
			Verdict: bpftest.ActOK, Counters: bpftest.Counters{"forward host_stack": 1}},
	})
}

// An expired translation's port is taken by the next new flow: a full
// slice refuses only while its flows live.
func TestPrivilegedEgressPortsOfExpiredFlowsAreTakenAgain(t *testing.T) {
	h := loadEgressHost(t, egressDesired())
	vif := h.k.VifProgram()
	flow := func(sport uint16) []byte {
		return fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: layers.IPProtocolTCP, Sport: sport, Dport: 80}).Bytes(t)
	}
	for sport := uint16(40000); sport < 40004; sport++ {
		if r := bpftest.Run(t, vif, flow(sport)); r.Verdict != bpftest.ActRedirect {
			t.Fatalf("flow %d: verdict %d", sport, r.Verdict)
		}
	}
	if r := bpftest.Run(t, vif, flow(40004)); r.Verdict != bpftest.ActShot {
		t.Fatalf("a fifth flow into a full slice: verdict %d, want refused", r.Verdict)
	}
	// Age every translation of a's slice past its deadline.
	st, err := h.k.Map(MapState)
	if err != nil {
		t.Fatal(err)
	}
	for p := uint32(sliceALo); p <= sliceALo+3; p++ {
		var m mapRecord
		if err := st.Lookup(p, &m); err != nil {
			t.Fatal(err)
		}
		m.ExpiresNs = 1
		if err := st.Put(p, m); err != nil {
			t.Fatal(err)
		}
	}
	for sport := uint16(40005); sport < 40009; sport++ {
		r := bpftest.Run(t, vif, flow(sport))
		if r.Verdict != bpftest.ActRedirect {
			t.Fatalf("flow %d after the slice's flows expired: verdict %d, want a port", sport, r.Verdict)
		}
		if p := l4Word(r.Out, 0); p < sliceALo || p > sliceALo+3 {
			t.Errorf("flow %d left by port %d, outside a's slice", sport, p)
		}
	}
}

// tcpSeg is f's bytes as a TCP segment with flags, seq and ack of its own
// (bpftest frames are SYNs) and no payload. The checksum is left stale: the
// programs patch it by difference and never check it.
func tcpSeg(t *testing.T, f bpftest.Frame, flags byte, seq, ack uint32) []byte {
	t.Helper()
	f.Proto, f.Payload = layers.IPProtocolTCP, []byte{}
	b := f.Bytes(t)
	const th = 14 + 20
	binary.BigEndian.PutUint32(b[th+4:], seq)
	binary.BigEndian.PutUint32(b[th+8:], ack)
	b[th+13] = flags
	return b
}

// A port whose connection the remote closed first (as an HTTP server
// does) is free as soon as the remote's ACK of the VM's FIN comes back, not
// 2 s later: the VM's socket is gone and the remote keeps TIME_WAIT, so
// nothing of it crosses again. An ACK short of the FIN frees nothing; a
// connection the VM closed first keeps its port for the hold, since the
// remote's FIN may yet be sent again.
func TestPrivilegedEgressPortIsFreeOnceTheRemoteThatClosedFirstAcksTheVMsFIN(t *testing.T) {
	const (
		fin = 0x01
		syn = 0x02
		ack = 0x10
	)
	h := loadEgressHost(t, egressDesired())
	vif, up := h.k.VifProgram(), h.k.UplinkProgram()
	out := func(sport uint16, flags byte, seq, ackn uint32) bpftest.Result {
		return bpftest.Run(t, vif, tcpSeg(t, fromVM(vmA, bpftest.Frame{Daddr: inet, Sport: sport, Dport: 80}), flags, seq, ackn))
	}
	in := func(port uint16, flags byte, seq, ackn uint32) bpftest.Result {
		return bpftest.Run(t, up, tcpSeg(t, bpftest.Frame{Src: inetMAC, Dst: h1MAC, Saddr: inet, Daddr: hostAddr, Sport: 80, Dport: port}, flags, seq, ackn))
	}
	ports := map[uint16]uint16{}
	for sport := uint16(40000); sport < 40004; sport++ {
		r := out(sport, syn, 99, 0)
		if r.Verdict != bpftest.ActRedirect {
			t.Fatalf("flow %d: verdict %d", sport, r.Verdict)
		}
		ports[sport] = l4Word(r.Out, 0)
		if r := in(ports[sport], syn|ack, 4999, 100); r.Verdict != bpftest.ActRedirect {
			t.Fatalf("SYN-ACK to port %d: verdict %d, want it into a", ports[sport], r.Verdict)
		}
	}
	probe := uint16(40200) // each probe a flow of its own: a flow keeps its port
	full := func(when string) {
		t.Helper()
		probe++
		if r := out(probe, syn, 99, 0); r.Verdict != bpftest.ActShot {
			t.Fatalf("%s: a new flow took port %d of a's full slice, want it refused", when, l4Word(r.Out, 0))
		}
	}
	full("four live connections")

	// 40000: the remote closes first; a acks its FIN and sends its own.
	p := ports[40000]
	for _, step := range []struct {
		what string
		r    bpftest.Result
	}{
		{"the remote's FIN", in(p, fin|ack, 5000, 100)},
		{"a's ACK of it", out(40000, ack, 100, 5001)},
		{"a's FIN", out(40000, fin|ack, 100, 5001)},
		{"an ACK short of a's FIN", in(p, ack, 5001, 100)},
	} {
		if step.r.Verdict != bpftest.ActRedirect {
			t.Fatalf("%s: verdict %d, want it through", step.what, step.r.Verdict)
		}
	}
	full("an ACK short of a's FIN")
	// 40001: a closes first; the remote's FIN and a's last ACK follow.
	q := ports[40001]
	out(40001, fin|ack, 100, 5000)
	in(q, fin|ack, 5000, 101)
	out(40001, ack, 101, 5001)
	full("a closed first, its last ACK sent")

	if r := in(p, ack, 5001, 101); r.Verdict != bpftest.ActRedirect {
		t.Fatalf("the remote's ACK of a's FIN: verdict %d, want it into a", r.Verdict)
	}
	r := out(40100, syn, 99, 0)
	if r.Verdict != bpftest.ActRedirect || l4Word(r.Out, 0) != p {
		t.Fatalf("a new flow after the remote acked a's FIN: verdict %d, port %d, want port %d at once", r.Verdict, l4Word(r.Out, 0), p)
	}
	full("the freed port taken again")
}

// timeExceeded is what a router sends back about the expired frame in: from
// the sender's gateway, quoting its IPv4 header and first 8 bytes after it.
func timeExceeded(t *testing.T, in bpftest.Frame) []byte {
	t.Helper()
	b := in.Bytes(t)
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		&layers.Ethernet{SrcMAC: vmac(gw), DstMAC: in.Src, EthernetType: layers.EthernetTypeIPv4},
		&layers.IPv4{Version: 4, TOS: 0xc0, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: gw.AsSlice(), DstIP: in.Saddr.AsSlice()},
		&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(11, 0)}, gopacket.Payload(b[14:14+20+8])); err != nil {
		t.Fatalf("build time exceeded: %v", err)
	}
	return buf.Bytes()
}

// One VM's fragments never push out another VM's fragment records: a VM
// holds at most 16 (egress_frag_places), each new one replacing its own
// older one, so a sends more first fragments than the whole table holds
// and b's datagram, begun before, still has its later fragment steered.
func TestPrivilegedEgressOneVMsFragmentsNeverPushOutAnotherVMs(t *testing.T) {
	h := loadEgressHost(t, egressDesired())
	vif := h.k.VifProgram()
	udp, tcp := layers.IPProtocolUDP, layers.IPProtocolTCP
	h.onLo(t, "b")
	bFirst := fromVM(vmB, bpftest.Frame{Daddr: inet, Proto: udp, Sport: 7000, Dport: 9000, IPID: 4242, MoreFragments: true})
	bLater := fromVM(vmB, bpftest.Frame{Daddr: inet, Proto: udp, IPID: 4242, FragOffset: 185})
	if r := bpftest.Run(t, vif, bFirst.Bytes(t)); r.Verdict != bpftest.ActRedirect {
		t.Fatalf("b's first fragment: verdict %d", r.Verdict)
	}

	h.onLo(t, "a")
	const tcpIDs = 2000 // past 65,536 UDP ids: more datagrams than egress_frags holds
	sent := 0
	for _, c := range []struct {
		proto layers.IPProtocol
		ids   int
	}{{udp, 65536}, {tcp, tcpIDs}} {
		in := fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: c.proto, Sport: 6000, Dport: 9000, MoreFragments: true}).Bytes(t)
		out := make([]byte, len(in)+64)
		for id := 0; id < c.ids; id++ {
			binary.BigEndian.PutUint16(in[14+4:], uint16(id)) // the IPv4 id; its checksum is patched, never checked
			// Run by hand, not bpftest.Run: tens of thousands of runs, and
			// only the verdict is wanted.
			ret, err := vif.Run(&ebpf.RunOptions{Data: in, DataOut: out})
			if err != nil || ret != uint32(bpftest.ActRedirect) {
				t.Fatalf("a's first fragment %d (%s): verdict %d, %v", id, c.proto, ret, err)
			}
			sent++
		}
	}
	frags, err := h.k.Map(MapFrags)
	if err != nil {
		t.Fatal(err)
	}
	var held int
	var k, next [12]byte
	for err := frags.NextKey(nil, &next); err == nil; err = frags.NextKey(k, &next) {
		k = next
		held++
	}
	if held != 17 {
		t.Errorf("egress_frags holds %d records after a's %d first fragments and b's one: want a's 16 and b's", held, sent)
	}
	aLater := func(proto layers.IPProtocol, id uint16) []byte {
		return fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: proto, IPID: id, FragOffset: 185}).Bytes(t)
	}
	if r := bpftest.Run(t, vif, aLater(tcp, tcpIDs-1)); r.Verdict != bpftest.ActRedirect {
		t.Errorf("a's latest datagram's later fragment: verdict %d, want it steered", r.Verdict)
	}
	if r := bpftest.Run(t, vif, aLater(udp, 0)); r.Verdict != bpftest.ActShot {
		t.Errorf("a's first datagram's later fragment, its record replaced by a's own later ones: verdict %d, want dropped", r.Verdict)
	}

	h.onLo(t, "b")
	if r := bpftest.Run(t, vif, bLater.Bytes(t)); r.Verdict != bpftest.ActRedirect {
		t.Fatalf("b's later fragment after a's %d first fragments: verdict %d, want it steered (b's record kept)", sent, r.Verdict)
	}
}
