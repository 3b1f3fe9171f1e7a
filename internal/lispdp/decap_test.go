package lispdp

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"
)

// TestPrivilegedDecapsulationTable runs lisp_decap on crafted LISP frames
// to the gateway's RLOCs: the exact inner frame handed on, the verdict, and
// the counters that moved (every drop reason has its row).
func TestPrivilegedDecapsulationTable(t *testing.T) {
	d := gateway(t)
	decap := d.Programs().Decap
	tcp, udp := layers.IPProtocolTCP, layers.IPProtocolUDP
	replyTCP := inner{proto: tcp, src: "10.2.0.2", dst: "10.1.0.11", sport: 80, dport: 33000, body: "reply"}
	replyUDP := inner{proto: udp, src: "10.2.0.2", dst: "10.1.0.12", sport: 53, dport: 5353, body: "answer"}
	// From path 1's remote RLOC to its local one; path 2 adds instance id 7.
	o1 := outer{src: "198.51.100.1", dst: "192.0.2.1", sport: 50000, ttl: 64, flags: 0x80, nonce: 0xabcdef}
	o2 := outer{src: "198.51.100.5", dst: "192.0.2.5", sport: 50001, ttl: 64, flags: 0x88, nonce: 0x123456, iidLSB: 7 << 8}
	with := func(o outer, f func(*outer)) outer { f(&o); return o }

	// expected inner packets, after the TTL and ECN rules
	ttl3 := replyTCP
	ttl3.ttl = 3
	ect := replyUDP
	ect.tos = 0xb8 | 2 // DSCP 46, ECT(0)
	ce := ect
	ce.tos = 0xb8 | 3

	for _, tc := range []struct {
		name    string
		frame   []byte
		want    []byte // nil: dropped, or untouched when verdict is next
		verdict int32
		counted map[string]uint64
	}{
		{"tcp from path 1", frame(macGW, macP1nh, o1.encap(replyTCP.ip(t))), frame(macGW, macP1nh, replyTCP.ip(t)),
			verdictNext, map[string]uint64{"decapsulated": 1}},
		{"udp from path 2 with instance id 7", frame(macGW, macP2nh, o2.encap(replyUDP.ip(t))), frame(macGW, macP2nh, replyUDP.ip(t)),
			verdictNext, map[string]uint64{"decapsulated": 1}},
		{"an outer TTL below the inner one becomes the inner TTL", frame(macGW, macP1nh, with(o1, func(o *outer) { o.ttl = 3 }).encap(replyTCP.ip(t))),
			frame(macGW, macP1nh, ttl3.ip(t)), verdictNext, map[string]uint64{"decapsulated": 1}},
		{"congestion marked outside is kept inside", frame(macGW, macP2nh, with(o2, func(o *outer) { o.tos = 3 }).encap(ect.ip(t))),
			frame(macGW, macP2nh, ce.ip(t)), verdictNext, map[string]uint64{"decapsulated": 1}},
		{"congestion marked over a not-ECT packet: dropped", frame(macGW, macP2nh, with(o2, func(o *outer) { o.tos = 3 }).encap(replyUDP.ip(t))),
			nil, verdictShot, map[string]uint64{"drop_ecn": 1}},
		{"path 2 without its instance id", frame(macGW, macP2nh, with(o2, func(o *outer) { o.flags, o.iidLSB = 0x80, 0 }).encap(replyUDP.ip(t))),
			nil, verdictShot, map[string]uint64{"drop_wrong_iid": 1}},
		{"path 2 with instance id 8", frame(macGW, macP2nh, with(o2, func(o *outer) { o.iidLSB = 8 << 8 }).encap(replyUDP.ip(t))),
			nil, verdictShot, map[string]uint64{"drop_wrong_iid": 1}},
		{"path 1 (no instance id) given one", frame(macGW, macP1nh, with(o1, func(o *outer) { o.flags, o.iidLSB = 0x88, 5<<8 }).encap(replyTCP.ip(t))),
			nil, verdictShot, map[string]uint64{"drop_wrong_iid": 1}},
		{"from an RLOC no path names", frame(macGW, macP1nh, with(o1, func(o *outer) { o.src = "198.51.100.9" }).encap(replyTCP.ip(t))),
			nil, verdictShot, map[string]uint64{"drop_unknown_rloc": 1}},
		{"path 1's remote RLOC to path 2's local one", frame(macGW, macP1nh, with(o1, func(o *outer) { o.dst = "192.0.2.5" }).encap(replyTCP.ip(t))),
			nil, verdictShot, map[string]uint64{"drop_unknown_rloc": 1}},
		{"N and V both set", frame(macGW, macP1nh, with(o1, func(o *outer) { o.flags = 0x90 }).encap(replyTCP.ip(t))),
			nil, verdictShot, map[string]uint64{"drop_malformed": 1}},
		{"inner IPv6", frame(macGW, macP1nh, o1.encap(inner{proto: tcp, src: "10.2.0.2", dst: "10.1.0.11", version: 6}.ip(t))),
			nil, verdictShot, map[string]uint64{"drop_malformed": 1}},
		{"outer length longer than the inner packet", frame(macGW, macP1nh, with(o1, func(o *outer) { o.lenDelta = 4 }).encap(append(replyTCP.ip(t), 0, 0, 0, 0))),
			nil, verdictShot, map[string]uint64{"drop_malformed": 1}},
		{"outer length beyond the frame", frame(macGW, macP1nh, with(o1, func(o *outer) { o.lenDelta = 40 }).encap(replyTCP.ip(t))),
			nil, verdictShot, map[string]uint64{"drop_malformed": 1}},
		{"cut inside the inner header", frame(macGW, macP1nh, with(o1, func(o *outer) { o.lenDelta = -30 }).encap(replyTCP.ip(t)[:10])),
			nil, verdictShot, map[string]uint64{"drop_malformed": 1}},
		{"an outer fragment", frame(macGW, macP1nh, with(o1, func(o *outer) { o.frag = 0x2000 }).encap(replyTCP.ip(t))),
			nil, verdictShot, map[string]uint64{"drop_fragment": 1}},
		// The inner source must be an EID its outer source is a locator
		// of (the gateway maps 10.2.0.0/16 behind both paths' RLOCs).
		{"inner source no mapping covers, from a known RLOC", frame(macGW, macP1nh, o1.encap(inner{proto: tcp, src: "10.66.6.6", dst: "10.1.0.11", sport: 80, dport: 33000}.ip(t))),
			nil, verdictShot, map[string]uint64{"drop_source_eid": 1}},
		{"inner source mapped behind another RLOC (10.5/16: path 2's only)", frame(macGW, macP1nh, o1.encap(inner{proto: udp, src: "10.5.0.1", dst: "10.1.0.12", sport: 53, dport: 5353}.ip(t))),
			nil, verdictShot, map[string]uint64{"drop_source_eid": 1}},
		{"inner source under a negative mapping inside a mapped prefix", frame(macGW, macP1nh, o1.encap(inner{proto: tcp, src: "10.2.9.1", dst: "10.1.0.11", sport: 80, dport: 33000}.ip(t))),
			nil, verdictShot, map[string]uint64{"drop_source_eid": 1}},
		{"the gateway's own EID as inner source", frame(macGW, macP1nh, o1.encap(inner{proto: tcp, src: "10.1.0.12", dst: "10.1.0.11", sport: 80, dport: 33000}.ip(t))),
			nil, verdictShot, map[string]uint64{"drop_source_eid": 1}},
		{"10.5/16 from path 2, its RLOC", frame(macGW, macP2nh, o2.encap(inner{proto: udp, src: "10.5.0.1", dst: "10.1.0.12", sport: 53, dport: 5353}.ip(t))),
			frame(macGW, macP2nh, inner{proto: udp, src: "10.5.0.1", dst: "10.1.0.12", sport: 53, dport: 5353}.ip(t)), verdictNext, map[string]uint64{"decapsulated": 1}},
		{"a locator of priority 255 may still send (10.4/16 behind path 1, unusable)", frame(macGW, macP1nh, o1.encap(inner{proto: tcp, src: "10.4.0.1", dst: "10.1.0.11", sport: 80, dport: 33000}.ip(t))),
			frame(macGW, macP1nh, inner{proto: tcp, src: "10.4.0.1", dst: "10.1.0.11", sport: 80, dport: 33000}.ip(t)), verdictNext, map[string]uint64{"decapsulated": 1}},
		{"LISP to an address that is no local RLOC: someone else's", frame(macGW, macP1nh, with(o1, func(o *outer) { o.dst = "192.0.2.77" }).encap(replyTCP.ip(t))),
			nil, verdictNext, map[string]uint64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := counters(t, d)
			verdict, out := run(t, decap, tc.frame)
			if verdict != tc.verdict {
				t.Errorf("verdict %d, want %d", verdict, tc.verdict)
			}
			want := tc.want
			if want == nil {
				want = tc.frame // a drop leaves the frame as it was
			}
			if !bytes.Equal(out, want) {
				t.Errorf("frame\n got %x\nwant %x", out, want)
			}
			if got := counterDelta(before, counters(t, d)); !equalCounts(got, tc.counted) {
				t.Errorf("counted %v, want %v", got, tc.counted)
			}
		})
	}

	t.Run("other traffic to a local RLOC: untouched, not counted", func(t *testing.T) {
		for _, in := range []inner{
			{proto: udp, src: "198.51.100.1", dst: "192.0.2.1", sport: 4342, dport: 4342, body: "map-reply"},
			{proto: udp, src: "198.51.100.1", dst: "192.0.2.1", sport: 4341, dport: 53},
			{proto: tcp, src: "198.51.100.1", dst: "192.0.2.1", sport: 1, dport: 4341},
			{src: "198.51.100.1", dst: "192.0.2.1"},
		} {
			f := frame(macGW, macP1nh, in.ip(t))
			before := counters(t, d)
			verdict, out := run(t, decap, f)
			if verdict != verdictNext || !bytes.Equal(out, f) {
				t.Errorf("%+v: verdict %d, frame changed %v", in, verdict, !bytes.Equal(out, f))
			}
			if got := counterDelta(before, counters(t, d)); len(got) != 0 {
				t.Errorf("%+v: counted %v", in, got)
			}
		}
	})
}

// TestPrivilegedEncapsulatedByOneEndIsDecapsulatedByTheOther: the far end,
// configured as the mirror image, gets back exactly the inner frame, and
// both ends count the path's packets and bytes.
func TestPrivilegedEncapsulatedByOneEndIsDecapsulatedByTheOther(t *testing.T) {
	gw := gateway(t)
	xtr := open(t, Options{})
	for id, p := range map[uint8]Path{1: path1, 2: path2} {
		p.LocalRLOC, p.RemoteRLOC = p.RemoteRLOC, p.LocalRLOC
		p.SrcMAC, p.DstMAC = p.DstMAC, p.SrcMAC
		if err := xtr.SetPath(id, p); err != nil {
			t.Fatal(err)
		}
	}
	// The far end maps the gateway's EIDs behind its RLOCs, or it would
	// refuse them as inner sources.
	if err := xtr.SetEID(netip.MustParsePrefix("10.1.0.0/16"), []PathChoice{{ID: 1, Priority: 1, Weight: 1}, {ID: 2, Priority: 1, Weight: 1}}); err != nil {
		t.Fatal(err)
	}
	encap, decap := gw.Programs().Encap, xtr.Programs().Decap
	for i, in := range []inner{
		{proto: layers.IPProtocolTCP, src: "10.1.0.11", dst: "10.2.0.2", sport: 33000, dport: 80, payload: 1000},
		{proto: layers.IPProtocolUDP, src: "10.1.0.12", dst: "10.2.0.2", sport: 5353, dport: 53, payload: 100},
	} {
		ip := in.ip(t)
		_, enc := run(t, encap, frame(macRtr, macGW, ip))
		verdict, dec := run(t, decap, enc)
		if verdict != verdictNext {
			t.Fatalf("decap verdict %d", verdict)
		}
		if want := frame(enc[:6], enc[6:12], ip); !bytes.Equal(dec, want) {
			t.Errorf("round trip %d\n got %x\nwant %x", i, dec, want)
		}
		id := uint8(i + 1)
		gs, err := gw.PathStats()
		if err != nil {
			t.Fatal(err)
		}
		xs, err := xtr.PathStats()
		if err != nil {
			t.Fatal(err)
		}
		if want := (Stats{TxPackets: 1, TxBytes: uint64(len(ip))}); gs[id] != want {
			t.Errorf("gateway path %d: %+v, want %+v", id, gs[id], want)
		}
		if want := (Stats{RxPackets: 1, RxBytes: uint64(len(ip))}); xs[id] != want {
			t.Errorf("xtr path %d: %+v, want %+v", id, xs[id], want)
		}
	}
}

// TestPrivilegedSuperpacketNotForALocalSocketIsDropped: on a kernel that
// keeps a tunnel superpacket's GSO state through bpf_skb_adjust_room,
// lisp_decap strips one whole only for a TCP socket of this node (the
// namespace test shows that case); TCP to no local socket, which the stack
// would forward and might segment again, is dropped and counted. (On a
// kernel with BPF_F_ADJ_ROOM_DECAP_L4_UDP the row holds too: BPF_PROG_RUN's
// superpacket has no GSO type, which the helper refuses to shrink.)
func TestPrivilegedSuperpacketNotForALocalSocketIsDropped(t *testing.T) {
	d := gateway(t)
	reply := inner{proto: layers.IPProtocolTCP, src: "10.2.0.2", dst: "10.1.0.11", sport: 80, dport: 33001, body: "reply"}
	o1 := outer{src: "198.51.100.1", dst: "192.0.2.1", sport: 50000, ttl: 64, flags: 0x80, nonce: 0xabcdef}
	c0 := counters(t, d)
	ret, _, _ := runGSO(t, d.Programs().Decap, frame(macGW, macP1nh, o1.encap(reply.ip(t))), 1400, 2)
	if ret != verdictShot {
		t.Errorf("verdict %d, want %d (dropped)", ret, verdictShot)
	}
	if c := counterDelta(c0, counters(t, d)); len(c) != 1 || c["drop_gso_decap"] != 1 {
		t.Errorf("counted %v, want drop_gso_decap 1", c)
	}
}
