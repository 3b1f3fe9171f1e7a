package portspace

import (
	"encoding/binary"
	"github.com/cilium/ebpf"
	"net/netip"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/csum"

	"github.com/google/gopacket/layers"
)

var (
	tcp  = layers.IPProtocolTCP
	udp  = layers.IPProtocolUDP
	icmp = layers.IPProtocolICMPv4
)

func fromInet(proto layers.IPProtocol, dport uint16) bpftest.Frame {
	return bpftest.Frame{Src: peerMAC, Dst: upMAC, Saddr: inet, Daddr: public, Proto: proto, Sport: 53, Dport: dport}
}

func in(s string) map[string]string  { return map[string]string{s: "in"} }
func out(s string) map[string]string { return map[string]string{s: "out"} }

// From the fabric: by destination port to the sliver that leases it (both
// edges of every range), the rest to the host unchanged; ICMP errors by the
// quoted source port; later fragments where their first went.
func TestPrivilegedFabricSteersByPortToTheLeasingSliver(t *testing.T) {
	k, f, links := loadFeature(t)
	syncPlan(t, f, testPlan(0))
	if links.slivers["s0-s1"] != s1If || links.slivers["s1-s2"] != s2If1 || !links.lo {
		t.Fatalf("sync attached %v (lo %v)", links.slivers, links.lo)
	}
	up := k.UplinkProgram()
	toSliver := func(name string, in bpftest.Frame, ifindex uint32, sliver string) row {
		return row{name: name, prog: up, in: in, verdict: bpftest.ActRedirect, to: ifindex, kind: bpftest.RedirectPeer, drop: "", counts: map[string]string{sliver: "in"}, wantDst: upMAC}
	}
	toHost := func(name string, in bpftest.Frame) row {
		return row{name: name, prog: up, in: in, verdict: bpftest.ActOK}
	}
	quoted := func(proto layers.IPProtocol, src netip.Addr, sport uint16) *bpftest.Frame {
		return &bpftest.Frame{Saddr: src, Daddr: inet, Proto: proto, Sport: sport, Dport: 53}
	}
	unreach := func(q *bpftest.Frame, typ uint8) bpftest.Frame {
		return bpftest.Frame{Src: peerMAC, Dst: upMAC, Saddr: inet, Daddr: public, Proto: icmp, ICMPType: typ, ICMPCode: 3, Quote: q}
	}
	first := fromInet(udp, 10001)
	first.IPID, first.MoreFragments = 77, true
	later := fromInet(udp, 0)
	later.IPID, later.FragOffset = 77, 5
	stray := later
	stray.IPID = 78
	arpReply := bpftest.Frame{Src: peerMAC, Dst: upMAC, Saddr: inet, Daddr: public, ARPOp: 2}
	arpReq := bpftest.Frame{Src: peerMAC, Dst: upMAC, Saddr: inet, Daddr: public, ARPOp: 1}
	run(t, k, f, []row{
		toSliver("tcp to the low edge of s1's lease", fromInet(tcp, 10000), s1If, "s1"),
		toSliver("udp to the high edge of s1's lease", fromInet(udp, 10099), s1If, "s1"),
		toSliver("tcp to the low edge of s2's lease", fromInet(tcp, 10100), s2If, "s2"),
		toSliver("udp to the high edge of s2's lease", fromInet(udp, 10199), s2If, "s2"),
		toSliver("a one-port lease", fromInet(tcp, 30000), s3If, "s3"),
		toHost("below s1's lease: the host's", fromInet(tcp, 9999)),
		toHost("above s2's lease: the host's", fromInet(udp, 10200)),
		toHost("above s3's one port", fromInet(tcp, 30001)),
		toHost("another address", bpftest.Frame{Src: peerMAC, Dst: upMAC, Saddr: inet, Daddr: other, Proto: tcp, Sport: 53, Dport: 10000}),
		toHost("IPv6", bpftest.Frame{Src: peerMAC, Dst: upMAC, EtherType: layers.EthernetTypeIPv6}),
		toHost("echo requests are the host's", bpftest.Frame{Src: peerMAC, Dst: upMAC, Saddr: inet, Daddr: public, Proto: icmp, ICMPType: 8, ICMPID: 10005}),
		toHost("an echo reply nobody asked for, even with a leased id", bpftest.Frame{Src: peerMAC, Dst: upMAC, Saddr: inet, Daddr: public, Proto: icmp, ICMPType: 0, ICMPID: 10005}),
		toHost("ARP requests are the host's", arpReq),
		{name: "an ARP reply for the address reaches the host and every sliver of the uplink", prog: up, in: arpReply, verdict: bpftest.ActOK, clones: []uint32{s1If, s2If, s3If}},
		toSliver("port unreachable about s1's port", unreach(quoted(udp, public, 10005), 3), s1If, "s1"),
		toSliver("time exceeded about s2's port", unreach(quoted(tcp, public, 10150), 11), s2If, "s2"),
		toHost("frag needed about the host's port", unreach(quoted(tcp, public, 9000), 3)),
		toHost("an error quoting another source", unreach(quoted(udp, other, 10005), 3)),
		toSliver("a first fragment goes by its port", first, s1If, "s1"),
		toSliver("its later fragment follows it", later, s1If, "s1"),
		toHost("a later fragment whose first went nowhere", stray),
	})
}

func fromS1(proto layers.IPProtocol, sport uint16) bpftest.Frame {
	return bpftest.Frame{Src: upMAC, Dst: peerMAC, Saddr: public, Daddr: inet, Proto: proto, Sport: sport, Dport: 53}
}

// What a sliver sends: only from its uplink's MAC and address and its own
// ports, ids and fragments; to the shared address, to whoever holds the port.
func TestPrivilegedASliverSendsOnlyFromItsOwnPorts(t *testing.T) {
	k, f, _ := loadFeature(t)
	syncPlan(t, f, testPlan(1)) // s1 sends (its link is ifindex 1)
	sl := k.SliverProgram()
	toFabric := func(name string, in bpftest.Frame) row {
		return row{name: name, prog: sl, in: in, verdict: bpftest.ActRedirect, to: uplinkIf, kind: bpftest.RedirectOut, counts: out("s1")}
	}
	dropped := func(name string, in bpftest.Frame, reason string) row {
		return row{name: name, prog: sl, in: in, verdict: bpftest.ActShot, drop: reason, counts: map[string]string{"s1": reason}}
	}
	with := func(fr bpftest.Frame, fn func(*bpftest.Frame)) bpftest.Frame { fn(&fr); return fr }
	errAbout := func(dst netip.Addr, dport uint16, proto layers.IPProtocol) bpftest.Frame {
		return bpftest.Frame{Src: upMAC, Dst: peerMAC, Saddr: public, Daddr: inet, Proto: icmp, ICMPType: 3, ICMPCode: 3,
			Quote: &bpftest.Frame{Saddr: inet, Daddr: dst, Proto: proto, Sport: 53, Dport: dport}}
	}
	first := with(fromS1(udp, 10000), func(f *bpftest.Frame) { f.IPID, f.MoreFragments = 5, true })
	later := bpftest.Frame{Src: upMAC, Dst: peerMAC, Saddr: public, Daddr: inet, Proto: udp, IPID: 5, FragOffset: 5}
	stray := with(later, func(f *bpftest.Frame) { f.IPID = 6 })
	hairpin := func(dst netip.Addr, dport uint16, mac []byte) bpftest.Frame {
		return bpftest.Frame{Src: upMAC, Dst: mac, Saddr: public, Daddr: dst, Proto: tcp, Sport: 10010, Dport: dport}
	}
	run(t, k, f, []row{
		toFabric("tcp from the low edge of its lease", fromS1(tcp, 10000)),
		toFabric("udp from the high edge", fromS1(udp, 10099)),
		dropped("from s2's port", fromS1(tcp, 10100), "ps_foreign_port"),
		dropped("from the host's port", fromS1(udp, 9999), "ps_foreign_port"),
		dropped("from another address", with(fromS1(tcp, 10000), func(f *bpftest.Frame) { f.Saddr = other }), "ps_foreign_ip"),
		dropped("from another MAC", with(fromS1(tcp, 10000), func(f *bpftest.Frame) { f.Src = evilMAC }), "ps_foreign_mac"),
		dropped("IPv6", bpftest.Frame{Src: upMAC, Dst: peerMAC, EtherType: layers.EthernetTypeIPv6}, "ps_not_ipv4"),
		dropped("GRE", with(fromS1(layers.IPProtocolGRE, 0), func(f *bpftest.Frame) {}), "ps_proto"),
		{name: "an ARP request as the host", prog: sl, in: bpftest.Frame{Src: upMAC, Dst: peerMAC, Saddr: public, Daddr: inet, ARPOp: 1},
			verdict: bpftest.ActRedirect, to: uplinkIf, kind: bpftest.RedirectOut, counts: out("s1")},
		dropped("an ARP reply", bpftest.Frame{Src: upMAC, Dst: peerMAC, Saddr: public, Daddr: inet, ARPOp: 2}, "ps_arp_forged"),
		dropped("an ARP request for another address", bpftest.Frame{Src: upMAC, Dst: peerMAC, Saddr: other, Daddr: inet, ARPOp: 1}, "ps_arp_forged"),
		dropped("an ARP request with another sender MAC", bpftest.Frame{Src: upMAC, Dst: peerMAC, Saddr: public, Daddr: inet, ARPOp: 1, ARPSHA: evilMAC}, "ps_arp_forged"),
		{name: "an echo request with an id of its lease leaves as is", prog: sl, in: bpftest.Frame{Src: upMAC, Dst: peerMAC, Saddr: public, Daddr: inet, Proto: icmp, ICMPType: 8, ICMPID: 10050},
			verdict: bpftest.ActRedirect, to: uplinkIf, kind: bpftest.RedirectOut, counts: out("s1"), icmpID: 10050},
		toFabric("port unreachable about its own port", errAbout(public, 10005, udp)),
		dropped("port unreachable about s2's port", errAbout(public, 10100, udp), "ps_foreign_port"),
		dropped("port unreachable about another address", errAbout(other, 10005, udp), "ps_foreign_port"),
		// A quoted later fragment has no ports, only payload that may look
		// like them (bpf/lib/icmp_error.h): nothing to vouch for it.
		dropped("port unreachable quoting a later fragment", with(errAbout(public, 10005, udp), func(f *bpftest.Frame) {
			q := *f.Quote
			q.FragOffset = 5
			f.Quote = &q
		}), "malformed"),
		dropped("an echo reply", bpftest.Frame{Src: upMAC, Dst: peerMAC, Saddr: public, Daddr: inet, Proto: icmp, ICMPType: 0, ICMPID: 10050}, "ps_icmp_refused"),
		dropped("a timestamp request", bpftest.Frame{Src: upMAC, Dst: peerMAC, Saddr: public, Daddr: inet, Proto: icmp, ICMPType: 13}, "ps_icmp_refused"),
		dropped("a later fragment of nothing it sent", stray, "ps_frag_unknown"),
		toFabric("a first fragment from its port", first),
		toFabric("its later fragment", later),
		{name: "hairpin to s2's port", prog: sl, in: hairpin(public, 10150, upMAC), verdict: bpftest.ActRedirect, to: s2If, kind: bpftest.RedirectPeer,
			counts: map[string]string{"s1": "out", "s2": "in"}, wantDst: upMAC},
		{name: "hairpin to s2's port on uplink 1", prog: sl, in: hairpin(public1, 20005, peerMAC), verdict: bpftest.ActRedirect, to: s2If1, kind: bpftest.RedirectPeer,
			counts: map[string]string{"s1": "out", "s2": "in"}, wantDst: upMAC},
		// One pass: made the host's in place (bpf_skb_change_type), not
		// redirected into the link's ingress to pass this program again.
		{name: "hairpin to the host: given the link's MAC, to its stack in one pass", prog: sl, in: hairpin(public, 22, upMAC), verdict: bpftest.ActOK, counts: out("s1"), wantDst: vifMAC},
		{name: "hairpin to the host, addressed to the link: its stack", prog: sl, in: hairpin(public, 22, vifMAC), verdict: bpftest.ActOK, counts: out("s1")},
		dropped("hairpin from s2's port", with(hairpin(public, 10150, upMAC), func(f *bpftest.Frame) { f.Sport = 10100 }), "ps_foreign_port"),
	})
	lo := k.LoopbackProgram()
	fromHost := func(dport uint16) bpftest.Frame {
		return bpftest.Frame{Saddr: public, Daddr: public, Proto: tcp, Sport: 40000, Dport: dport}
	}
	run(t, k, f, []row{
		{name: "the host to s2's port on its own address", prog: lo, in: fromHost(10100), verdict: bpftest.ActRedirect, to: s2If, kind: bpftest.RedirectOut, counts: in("s2"), wantDst: upMAC},
		{name: "the host to its own port", prog: lo, in: fromHost(22), verdict: bpftest.ActOK},
		{name: "the host to 127.0.0.1", prog: lo, in: bpftest.Frame{Saddr: netip.MustParseAddr("127.0.0.1"), Daddr: netip.MustParseAddr("127.0.0.1"), Proto: tcp, Sport: 1, Dport: 10100}, verdict: bpftest.ActOK},
	})
}

// Two slivers ping the same remote with the same id (the paper's unsolved
// case): each leaves with an id of its own lease, and each reply goes back
// to its sender alone with the sender's id restored, as does an ICMP error
// quoting the request.
func TestPrivilegedTwoSliversPingingOneRemoteEachGetTheirOwnReplies(t *testing.T) {
	k, f, _ := loadFeature(t)
	sl := k.SliverProgram()
	ping := bpftest.Frame{Src: upMAC, Dst: peerMAC, Saddr: public, Daddr: inet, Proto: icmp, ICMPType: 8, ICMPID: 1}
	wire := map[string]uint16{}
	for _, s := range []struct {
		name   string
		slot   uint32
		lo, hi uint16
	}{{"s1", 1, 10000, 10099}, {"s2", 2, 10100, 10199}} {
		syncPlan(t, f, testPlan(s.slot))
		in := ping.Bytes(t)
		opts := &ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in))}
		ret, err := sl.Run(opts)
		if err != nil || ret != bpftest.ActRedirect {
			t.Fatalf("%s's ping: verdict %d, %v", s.name, ret, err)
		}
		id := binary.BigEndian.Uint16(opts.DataOut[14+20+4:])
		if id < s.lo || id > s.hi {
			t.Fatalf("%s's ping left with id %d, outside its lease %d-%d", s.name, id, s.lo, s.hi)
		}
		if csum.Checksum(opts.DataOut[14+20:]) != 0 {
			t.Fatalf("%s's ping: ICMP checksum broken by the rewrite", s.name)
		}
		wire[s.name] = id
	}
	syncPlan(t, f, testPlan(0))
	reply := func(id uint16) bpftest.Frame {
		return bpftest.Frame{Src: peerMAC, Dst: upMAC, Saddr: inet, Daddr: public, Proto: icmp, ICMPType: 0, ICMPID: id}
	}
	expired := func(id uint16) bpftest.Frame {
		return bpftest.Frame{Src: peerMAC, Dst: upMAC, Saddr: other, Daddr: public, Proto: icmp, ICMPType: 11,
			Quote: &bpftest.Frame{Saddr: public, Daddr: inet, Proto: icmp, ICMPType: 8, ICMPID: id}}
	}
	up := k.UplinkProgram()
	run(t, k, f, []row{
		{name: "s1's reply", prog: up, in: reply(wire["s1"]), verdict: bpftest.ActRedirect, to: s1If, kind: bpftest.RedirectPeer, counts: in("s1"), icmpID: 1},
		{name: "s2's reply", prog: up, in: reply(wire["s2"]), verdict: bpftest.ActRedirect, to: s2If, kind: bpftest.RedirectPeer, counts: in("s2"), icmpID: 1},
		{name: "time exceeded about s2's ping", prog: up, in: expired(wire["s2"]), verdict: bpftest.ActRedirect, to: s2If, kind: bpftest.RedirectPeer, counts: in("s2"), icmpID: 1},
		{name: "a reply with an id nobody sent", prog: up, in: reply(wire["s1"] + 1), verdict: bpftest.ActOK},
	})
}

// A fragment record is made the same way for datagrams to a sliver and from
// one (bpf/lib/portspace.h, portspace_frag_record): only a new record takes a unit
// of the sliver's share; the same first fragment again refreshes its record
// for nothing. With a share of one record, a first fragment seen twice is
// refused nothing, in either direction, and a second datagram is refused.
func TestPrivilegedAFirstFragmentSeenAgainTakesNoShareEitherWay(t *testing.T) {
	k, f, _ := loadFeature(t)
	syncPlan(t, f, testPlan(1)) // s1 (slot 1) sends from ifindex 1
	cfg, err := k.Map("portspace_config")
	if err != nil {
		t.Fatal(err)
	}
	var one limitsRecord
	one.IntervalNs[shareFrags] = uint64(time.Hour) // one record an hour, no burst
	if err := cfg.Put(uint32(0), one); err != nil {
		t.Fatal(err)
	}
	shares, err := k.Map("portspace_shares")
	if err != nil {
		t.Fatal(err)
	}
	refused := func() uint64 {
		t.Helper()
		var s shareRecord
		if err := shares.Lookup(uint32(1), &s); err != nil {
			t.Fatalf("s1's share: %v", err)
		}
		return s.Refused[shareFrags]
	}
	reset := func() {
		t.Helper()
		if err := shares.Put(uint32(1), shareRecord{}); err != nil {
			t.Fatal(err)
		}
	}

	// From the fabric, to s1's port.
	reset()
	first := fromInet(udp, 10001)
	first.IPID, first.MoreFragments = 91, true
	second := first
	second.IPID = 92
	later := fromInet(udp, 0)
	later.IPID, later.FragOffset = 92, 5
	up := k.UplinkProgram()
	toS1 := func(name string, fr bpftest.Frame) row {
		return row{name: name, prog: up, in: fr, verdict: bpftest.ActRedirect, to: 1, kind: bpftest.RedirectPeer, counts: in("s1"), wantDst: upMAC} // s1's link is ifindex 1 here
	}
	run(t, k, f, []row{
		toS1("inbound: a first fragment", first),
		toS1("inbound: the same first fragment again", first),
	})
	if n := refused(); n != 0 {
		t.Errorf("inbound: s1 was refused %d fragment records for one datagram seen twice, want 0", n)
	}
	run(t, k, f, []row{
		toS1("inbound: a second datagram's first fragment is delivered", second),
		{name: "inbound: but not recorded, so its later fragment is the host's", prog: up, in: later, verdict: bpftest.ActOK},
	})
	if n := refused(); n != 1 {
		t.Errorf("inbound: s1 was refused %d records for a second datagram over its share, want 1", n)
	}

	// From s1, to the fabric.
	reset()
	sl := k.SliverProgram()
	out1 := fromS1(udp, 10000)
	out1.IPID, out1.MoreFragments = 93, true
	out2 := out1
	out2.IPID = 94
	toFabric := func(name string, in bpftest.Frame) row {
		return row{name: name, prog: sl, in: in, verdict: bpftest.ActRedirect, to: uplinkIf, kind: bpftest.RedirectOut, counts: out("s1")}
	}
	run(t, k, f, []row{
		toFabric("outbound: a first fragment", out1),
		toFabric("outbound: the same first fragment again", out1),
	})
	if n := refused(); n != 0 {
		t.Errorf("outbound: s1 was refused %d fragment records for one datagram sent twice, want 0", n)
	}
	run(t, k, f, []row{
		{name: "outbound: a second datagram over its share is dropped", prog: sl, in: out2, verdict: bpftest.ActShot, drop: "ps_over_share",
			counts: map[string]string{"s1": "ps_over_share"}},
	})
}
