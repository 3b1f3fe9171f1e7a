package lispdp

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/csum"
)

const (
	verdictNext     = -1
	verdictShot     = 2
	verdictRedirect = 7
)

var (
	path1 = Path{Ifindex: 101, LocalRLOC: addr("192.0.2.1"), RemoteRLOC: addr("198.51.100.1"),
		SrcMAC: macP1, DstMAC: macP1nh, MTU: 1500}
	path2 = Path{Ifindex: 102, LocalRLOC: addr("192.0.2.5"), RemoteRLOC: addr("198.51.100.5"),
		SrcMAC: macP2, DstMAC: macP2nh, MTU: 1500, InstanceID: 7, UseInstanceID: true}
	// No MACs: the kernel resolves the next hop (bpf_redirect_neigh).
	path4 = Path{Ifindex: 104, LocalRLOC: addr("192.0.2.9"), RemoteRLOC: addr("198.51.100.9"), MTU: 1500}
)

// gateway is a datapath set up as the access gateway of the issue: two
// paths (the second with instance id 7), the server prefix over both, a
// negative hole in it, broken mappings, and two pinned subflow sources.
func gateway(t testing.TB) *Kernel {
	t.Helper()
	d := open(t, Options{})
	for id, p := range map[uint8]Path{1: path1, 2: path2, 4: path4} {
		if err := d.SetPath(id, p); err != nil {
			t.Fatal(err)
		}
	}
	for pfx, paths := range map[string][]PathChoice{
		"10.6.0.0/16": {{ID: 4, Priority: 1, Weight: 1}},
		"10.2.0.0/16": {{ID: 1, Priority: 1, Weight: 50}, {ID: 2, Priority: 1, Weight: 50}},
		"10.2.9.0/24": nil,                                      // negative: native
		"10.3.0.0/16": {{ID: 3, Priority: 1, Weight: 1}},        // path 3 never configured
		"10.4.0.0/16": {{ID: 1, Priority: Unusable, Weight: 1}}, // nothing usable
		"10.5.0.0/16": {{ID: 2, Priority: 1, Weight: 1}},        // path 1 not among them
	} {
		if err := d.SetEID(netip.MustParsePrefix(pfx), paths); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.PinSource(addr("10.1.0.11"), 1); err != nil {
		t.Fatal(err)
	}
	if err := d.PinSource(addr("10.1.0.12"), 2); err != nil {
		t.Fatal(err)
	}
	return d
}

// expectEncap is the frame an inner packet should leave as on path p.
func expectEncap(t testing.TB, in inner, p Path) []byte {
	t.Helper()
	ip := in.ip(t)
	var sport, dport uint16
	if in.proto == layers.IPProtocolTCP || in.proto == layers.IPProtocolUDP {
		sport, dport = in.sport, in.dport
	}
	proto := uint8(in.proto)
	if proto == 0 {
		proto = 1
	}
	h := FlowHash(addr(in.src), addr(in.dst), proto, sport, dport)
	ttl := in.ttl
	if ttl == 0 {
		ttl = 64
	}
	o := outer{src: p.LocalRLOC.String(), dst: p.RemoteRLOC.String(), sport: SourcePort(h),
		ttl: ttl, tos: in.tos, flags: 0x80}
	if p.UseInstanceID {
		o.flags |= 0x08
		o.iidLSB = p.InstanceID << 8
	}
	if p.DstMAC == nil {
		return frame(macRtr, macGW, o.encap(ip)) // left for the kernel to fill
	}
	return frame(p.DstMAC, p.SrcMAC, o.encap(ip))
}

// sameButNonce compares an encapsulated frame with the expected one, the
// 24-bit nonce (random per packet) aside.
func sameButNonce(t testing.TB, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("length %d, want %d\n got %s\nwant %s", len(got), len(want), hex.EncodeToString(got), hex.EncodeToString(want))
	}
	g := bytes.Clone(got)
	copy(g[14+29:14+32], want[14+29:14+32])
	if !bytes.Equal(g, want) {
		t.Fatalf("frame differs\n got %s\nwant %s", hex.EncodeToString(got), hex.EncodeToString(want))
	}
}

// TestPrivilegedEncapsulationTable runs lisp_encap on crafted frames: the
// exact frame out (nonce aside), the verdict and the counters that moved.
func TestPrivilegedEncapsulationTable(t *testing.T) {
	d := gateway(t)
	encap := d.Programs().Encap
	tcp, udp, icmp := layers.IPProtocolTCP, layers.IPProtocolUDP, layers.IPProtocolICMPv4

	// The unpinned flow's path is the datapath's hash slot, computed here.
	unpinned := inner{proto: tcp, src: "10.1.0.50", dst: "10.2.0.2", sport: 40000, dport: 80, body: "unpinned"}
	e, err := eidEntry([]PathChoice{{ID: 1, Priority: 1, Weight: 50}, {ID: 2, Priority: 1, Weight: 50}})
	if err != nil {
		t.Fatal(err)
	}
	unpinnedPath := map[uint8]Path{1: path1, 2: path2}[pickSlot(e, FlowHash(addr("10.1.0.50"), addr("10.2.0.2"), 6, 40000, 80))]

	for _, tc := range []struct {
		name    string
		in      inner
		path    *Path // encapsulated onto; nil: verdict/untouched as below
		verdict int32
		counted map[string]uint64
	}{
		{"tcp from a source pinned to path 1", inner{proto: tcp, src: "10.1.0.11", dst: "10.2.0.2", sport: 33000, dport: 80, body: "hello"},
			&path1, verdictRedirect, map[string]uint64{"encapsulated": 1, "pinned": 1}},
		{"udp from a source pinned to path 2 carries instance id 7", inner{proto: udp, src: "10.1.0.12", dst: "10.2.0.2", sport: 5353, dport: 53, body: "query"},
			&path2, verdictRedirect, map[string]uint64{"encapsulated": 1, "pinned": 1}},
		{"tcp from a pinned source keeps TTL and TOS in the outer header", inner{proto: tcp, src: "10.1.0.11", dst: "10.2.7.7", sport: 1, dport: 2, ttl: 9, tos: 0xb9},
			&path1, verdictRedirect, map[string]uint64{"encapsulated": 1, "pinned": 1}},
		{"icmp from a pinned source", inner{proto: icmp, src: "10.1.0.12", dst: "10.2.0.2"},
			&path2, verdictRedirect, map[string]uint64{"encapsulated": 1, "pinned": 1}},
		{"a path without MACs leaves them to the kernel's neighbour table", inner{proto: tcp, src: "10.1.0.50", dst: "10.6.0.1", sport: 1, dport: 2},
			&path4, verdictRedirect, map[string]uint64{"encapsulated": 1}},
		{"unpinned tcp takes the hash's slot", unpinned, &unpinnedPath, verdictRedirect, map[string]uint64{"encapsulated": 1}},
		{"a pin to a path the mapping does not list is not taken", inner{proto: tcp, src: "10.1.0.11", dst: "10.5.0.1", sport: 1, dport: 2},
			&path2, verdictRedirect, map[string]uint64{"encapsulated": 1}},
		{"MTU edge: 1464 inner bytes make 1500 outer", inner{proto: udp, src: "10.1.0.11", dst: "10.2.0.2", sport: 1, dport: 9, payload: 1464 - 28},
			&path1, verdictRedirect, map[string]uint64{"encapsulated": 1, "pinned": 1}},
		{"MTU edge: 1465 inner bytes would make 1501: dropped", inner{proto: udp, src: "10.1.0.11", dst: "10.2.0.2", sport: 1, dport: 9, payload: 1465 - 28},
			nil, verdictShot, map[string]uint64{"drop_too_big": 1}},
		{"negative mapping: native, untouched", inner{proto: tcp, src: "10.1.0.11", dst: "10.2.9.9", sport: 1, dport: 2},
			nil, verdictNext, map[string]uint64{"native": 1}},
		{"not an EID: untouched, not counted", inner{proto: tcp, src: "10.1.0.11", dst: "203.0.113.9", sport: 1, dport: 2},
			nil, verdictNext, map[string]uint64{}},
		{"mapped to a path never configured: dropped", inner{proto: tcp, src: "10.1.0.50", dst: "10.3.0.1", sport: 1, dport: 2},
			nil, verdictShot, map[string]uint64{"drop_no_path": 1}},
		{"every RLOC unusable (priority 255): dropped", inner{proto: tcp, src: "10.1.0.50", dst: "10.4.0.1", sport: 1, dport: 2},
			nil, verdictShot, map[string]uint64{"drop_no_path": 1}},
		{"every RLOC unusable, even for a pinned source", inner{proto: tcp, src: "10.1.0.11", dst: "10.4.0.1", sport: 1, dport: 2},
			nil, verdictShot, map[string]uint64{"drop_no_path": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := frame(macRtr, macGW, tc.in.ip(t))
			before := counters(t, d)
			verdict, out := run(t, encap, in)
			if verdict != tc.verdict {
				t.Errorf("verdict %d, want %d", verdict, tc.verdict)
			}
			if tc.path != nil {
				sameButNonce(t, out, expectEncap(t, tc.in, *tc.path))
				if out[14+28]&0x80 == 0 {
					t.Error("N bit clear")
				}
			} else if !bytes.Equal(out, in) {
				t.Errorf("frame changed\n got %x\nwant %x", out, in)
			}
			if got := counterDelta(before, counters(t, d)); !equalCounts(got, tc.counted) {
				t.Errorf("counted %v, want %v", got, tc.counted)
			}
		})
	}

	t.Run("not IPv4: untouched", func(t *testing.T) {
		arp := frame(macRtr, macGW, make([]byte, 28))
		arp[12], arp[13] = 0x08, 0x06
		v6 := frame(macRtr, macGW, make([]byte, 40))
		v6[12], v6[13] = 0x86, 0xdd
		// (BPF_PROG_RUN refuses IPv4 frames shorter than an IPv4 header.)
		ihl4 := frame(macRtr, macGW, inner{proto: tcp, src: "10.1.0.11", dst: "10.2.0.2"}.ip(t))
		ihl4[14] = 0x44
		for _, f := range [][]byte{arp, v6, ihl4} {
			verdict, out := run(t, encap, f)
			if verdict != verdictNext || !bytes.Equal(out, f) {
				t.Errorf("%x: verdict %d, out %x", f, verdict, out)
			}
		}
	})

	t.Run("nonces differ from packet to packet", func(t *testing.T) {
		in := frame(macRtr, macGW, inner{proto: tcp, src: "10.1.0.11", dst: "10.2.0.2", sport: 1, dport: 2}.ip(t))
		seen := map[string]bool{}
		for range 8 {
			_, out := run(t, encap, in)
			seen[string(out[14+29:14+32])] = true
		}
		if len(seen) < 7 {
			t.Errorf("8 packets, %d distinct nonces", len(seen))
		}
	})
}

// TestPrivilegedEncapsulationChecksGSOSegmentsNotTheSuperpacket: a GSO
// superpacket larger than the path MTU is not too big when its segments,
// with the 36 bytes added, fit. BPF_PROG_RUN cannot set a GSO type, so the
// kernel's adjust_room refuses such an skb (encap_failed): what this shows
// is the MTU check letting it through; the namespace test
// (TestPrivilegedSubflowsStayOnTheirPaths, TSO on) shows real superpackets
// encapsulated, segmented and delivered.
func TestPrivilegedEncapsulationChecksGSOSegmentsNotTheSuperpacket(t *testing.T) {
	d := gateway(t)
	encap := d.Programs().Encap
	in := inner{proto: layers.IPProtocolTCP, src: "10.1.0.11", dst: "10.2.0.2", sport: 33000, dport: 80, payload: 3000} // BPF_PROG_RUN takes at most a page
	f := frame(macRtr, macGW, in.ip(t))                                                                                 // TCP header 20 bytes: segment = gso_size + 40
	for _, tc := range []struct {
		name    string
		gsoSize uint32
		counted string
	}{
		{"segments fit with room left by the sender", 1424, "drop_encap_failed"},
		{"segments fit once gso_size is lowered by 36", 1460, "drop_encap_failed"},
		{"segments larger than the path", 1461, "drop_too_big"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := counters(t, d)
			verdict, _, _ := runGSO(t, encap, f, tc.gsoSize, 3)
			if verdict != verdictShot {
				t.Fatalf("verdict %d, want %d", verdict, verdictShot)
			}
			if got := counterDelta(before, counters(t, d)); !equalCounts(got, map[string]uint64{tc.counted: 1}) {
				t.Errorf("counted %v, want %s", got, tc.counted)
			}
		})
	}
}

func equalCounts(a, b map[string]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestPrivilegedTooBigWithDFIsAnsweredWithFragmentationNeeded: RFC 9300
// §7.2's stateful approach. A DF packet one byte too big for its path
// becomes, in place, ICMP fragmentation needed with the MTU left for inner
// packets (1464), quoting its header and 8 bytes, from its destination to
// its source, MACs swapped; at egress it goes into the same interface's
// ingress, at ingress back out. An ICMP error is never answered.
func TestPrivilegedTooBigWithDFIsAnsweredWithFragmentationNeeded(t *testing.T) {
	d := gateway(t)
	progs := d.Programs()
	in := inner{proto: layers.IPProtocolTCP, src: "10.1.0.11", dst: "10.2.0.2", sport: 33000, dport: 80, payload: 1465 - 40}
	ip := in.ip(t)
	if ip[6]&0x40 == 0 {
		t.Fatal("test packet lacks DF")
	}
	want := func() []byte {
		eth := &layers.Ethernet{SrcMAC: macRtr, DstMAC: macGW, EthernetType: layers.EthernetTypeIPv4}
		ip4 := &layers.IPv4{Version: 4, IHL: 5, TOS: 0xc0, TTL: 64, Protocol: layers.IPProtocolICMPv4,
			SrcIP: addr("10.2.0.2").AsSlice(), DstIP: addr("10.1.0.11").AsSlice()}
		icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4CodeFragmentationNeeded),
			Seq: 1500 - Overhead}
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
			eth, ip4, icmp, gopacket.Payload(ip[:28])); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}()
	for _, prog := range []struct {
		name string
		p    *ebpf.Program
	}{{"egress", progs.Encap}, {"ingress", progs.EncapIn}} {
		t.Run(prog.name, func(t *testing.T) {
			before := counters(t, d)
			verdict, out := run(t, prog.p, frame(macRtr, macGW, ip))
			if verdict != verdictRedirect {
				t.Errorf("verdict %d, want redirect", verdict)
			}
			if !bytes.Equal(out, want) {
				t.Errorf("answer\n got %x\nwant %x", out, want)
			}
			if got, w := counterDelta(before, counters(t, d)), map[string]uint64{"icmp_too_big": 1}; !equalCounts(got, w) {
				t.Errorf("counted %v, want %v", got, w)
			}
		})
	}
	t.Run("an ICMP error too big is dropped, not answered", func(t *testing.T) {
		e := inner{src: "10.1.0.11", dst: "10.2.0.2", payload: 1465 - 28}.ip(t)
		e[6] |= 0x40 // DF
		e[20] = 3    // destination unreachable
		csum.SetIPv4(e)
		before := counters(t, d)
		verdict, _ := run(t, progs.Encap, frame(macRtr, macGW, e))
		if verdict != verdictShot {
			t.Errorf("verdict %d, want drop", verdict)
		}
		if got, w := counterDelta(before, counters(t, d)), map[string]uint64{"drop_too_big": 1}; !equalCounts(got, w) {
			t.Errorf("counted %v, want %v", got, w)
		}
	})
}
