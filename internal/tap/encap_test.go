package tap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/csum"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/tappolicy"
	"github.com/onehop/onehop/internal/tapwire"
)

// The fabric the BPF_PROG_RUN hosts sit on: their uplink addresses and a
// collector beside them.
var (
	hostAddr = map[string]netip.Addr{"h1": netip.MustParseAddr("192.168.50.11"), "h2": netip.MustParseAddr("192.168.50.12")}
	colAddr  = netip.MustParseAddr("192.168.50.200")
	colMAC   = bpftest.MustMAC("aa:00:00:00:00:c0")
)

// fabricNeighbor is the uplink's neighbour table: the collector only.
func fabricNeighbor(ip netip.Addr) (net.HardwareAddr, error) {
	if ip == colAddr {
		return colMAC, nil
	}
	return nil, errors.New("not resolved")
}

func colRule(id uint32, s, r intent.TapEnd, encap string) intent.TapRule {
	return intent.TapRule{ID: id, Policy: "col", Sender: s, Receiver: r, Collector: colAddr.String(), Encap: encap}
}

// wrapped is inner (an Ethernet frame) as a copy to the collector from h1,
// written out field by field (not with EncapHeader: the test's own
// reading of the formats).
func wrapped(t *testing.T, encap string, session uint16, seq uint32, inner []byte) []byte {
	t.Helper()
	var gre, er []byte
	switch encap {
	case tappolicy.EncapGRE:
		gre = []byte{0x00, 0x00, 0x65, 0x58} // no flags, transparent Ethernet bridging
	case tappolicy.EncapERSPAN2:
		gre = []byte{0x10, 0x00, 0x88, 0xbe, 0, 0, 0, 0} // S, ERSPAN II, sequence
		binary.BigEndian.PutUint32(gre[4:], seq)
		er = []byte{0x10 /* version 1 */, 0x00, byte(session >> 8), byte(session), 0, 0, 0, 0}
	case tappolicy.EncapERSPAN3:
		gre = []byte{0x10, 0x00, 0x22, 0xeb, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(gre[4:], seq)
		er = []byte{0x20 /* version 2 */, 0x00, byte(session >> 8), byte(session), 0, 0, 0, 0 /* timestamp */, 0, 0, 0, 0x02 /* Gra 01 */}
	}
	ip := []byte{0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 47, 0, 0, 192, 168, 50, 11, 192, 168, 50, 200}
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(gre)+len(er)+len(inner)))
	csum.SetIPv4(ip)
	out := append(append(append([]byte{}, colMAC...), h1MAC...), 0x08, 0x00)
	out = append(append(append(append(out, ip...), gre...), er...), inner...)
	return out
}

// TestPrivilegedCopiesToACollectorAreWrappedInGREAndERSPAN runs the
// sender's edge with collector rules beside a local and a remote monitor:
// each copy to the collector leaves the uplink wrapped (outer Ethernet to
// the collector's MAC, IPv4 from the host's address, GRE, ERSPAN), the
// inner frame as the receiver sees it, and production is the same bytes as
// without the TAP.
func TestPrivilegedCopiesToACollectorAreWrappedInGREAndERSPAN(t *testing.T) {
	const tcp, udp = 6, 17
	none := [2]uint16{}
	taps := []intent.TapRule{
		rule(1, vm(web1), vm(web3), mon1, "h1"),
		withFilter(rule(2, vm(web1), vm(web2), mon2, "h2"), tcp, none, [2]uint16{80, 80}),
		withFilter(colRule(11, vm(web1), vm(web3), tappolicy.EncapERSPAN2), tcp, none, [2]uint16{22, 22}),
		withFilter(colRule(12, vm(web1), anyEnd, tappolicy.EncapERSPAN3), udp, none, [2]uint16{5353, 5353}),
		withFilter(colRule(13, vm(web1), vm(web2), tappolicy.EncapGRE), tcp, none, [2]uint16{80, 80}),
		// A capture of policy 11 (the controller's collector rule), here
		// to the same collector.
		withFilter(colRule(11|intent.TapCapture, vm(web1), vm(web3), tappolicy.EncapERSPAN2), tcp, none, [2]uint16{23, 23}),
	}
	l := newLab(t, "up0", "vif-web3", "vif-mon1", "vif-mon4")
	h := newHost(t, l, "h1", h1MAC, h1Desired(taps), map[netip.Addr]net.HardwareAddr{web2: h2MAC, mon2: h2MAC})
	from := func(dst netip.Addr, proto layers.IPProtocol, dport uint16) frame {
		return frame{Src: vmac(web1), Dst: vmac(dst), Saddr: web1, Daddr: dst, Proto: proto, Sport: 40000, Dport: dport}
	}
	seen := func(f frame) []byte { return asSeen(f.bytes(t)) }
	toFabric := func(f frame) frame { f.Src, f.Dst = h1MAC, h2MAC; return f }
	ssh, dns, web, telnet := from(web3, layers.IPProtocolTCP, 22), from(web2, layers.IPProtocolUDP, 5353), from(web2, layers.IPProtocolTCP, 80), from(web3, layers.IPProtocolTCP, 23)
	h.runRows(t, h.k.VifProgram(), []row{
		{name: "erspan2: a local receiver, a local monitor too: its copy, then the wrapped one",
			in: ssh, verdict: bpftest.ActRedirect, to: "vif-web3",
			copies:  []copyWant{{"vif-mon1", seen(ssh)}, {"up0", wrapped(t, "erspan2", 11, 0, seen(ssh))}},
			forward: map[string]uint64{"tap_copy_local": 1, "tap_copy_remote": 1}, copied: []uint32{1, 11}},
		{name: "erspan2 again: the sequence moves on",
			in: ssh, verdict: bpftest.ActRedirect, to: "vif-web3",
			copies:  []copyWant{{"vif-mon1", seen(ssh)}, {"up0", wrapped(t, "erspan2", 11, 1, seen(ssh))}},
			forward: map[string]uint64{"tap_copy_local": 1, "tap_copy_remote": 1}, copied: []uint32{1, 11}},
		{name: "a capture of the same policy to the same collector: one target (one share), its sequence goes on",
			in: telnet, verdict: bpftest.ActRedirect, to: "vif-web3",
			copies:  []copyWant{{"vif-mon1", seen(telnet)}, {"up0", wrapped(t, "erspan2", 11, 2, seen(telnet))}},
			forward: map[string]uint64{"tap_copy_local": 1, "tap_copy_remote": 1}, copied: []uint32{1, 11 | intent.TapCapture}},
		{name: "gre: beside a remote monitor's marked copy, production first",
			in: web, verdict: bpftest.ActRedirect, to: "up0",
			copies:  []copyWant{{"up0", remoteCopy(t, toFabric(web), h2MAC)}, {"up0", wrapped(t, "gre", 0, 0, seen(web))}},
			forward: map[string]uint64{"tap_copy_remote": 2}, copied: []uint32{2, 13}},
		{name: "not matching any collector rule: no wrapped copy",
			in: from(web2, layers.IPProtocolUDP, 5354), verdict: bpftest.ActRedirect, to: "up0"},
	})
	// ERSPAN III carries a timestamp: every other byte as written, and
	// the whole read back by a decoder.
	h.lab.capture["up0"].drain(t)
	before := h.statsByID(t)[12].Packets
	got := h.run(t, h.k.VifProgram(), dns.bytes(t))
	if len(got.Clones) != 2 {
		t.Fatalf("erspan3: %d clones (%v), want production and one copy", len(got.Clones), got.Clones)
	}
	var b []byte
	for range 2 { // production first, then the copy
		var err error
		if b, err = h.lab.capture["up0"].next(2e9); err != nil || b == nil {
			t.Fatalf("erspan3 copy: %v (nothing arrived: %v)", err, b == nil)
		}
	}
	want := wrapped(t, "erspan3", 12, 0, seen(dns))
	ts := binary.BigEndian.Uint32(b[46:50])
	copy(want[46:50], b[46:50])
	if !bytes.Equal(b, want) || ts == 0 {
		t.Fatalf("erspan3 copy:\n got %x\nwant %x (timestamp %d)", b, want, ts)
	}
	if st := h.statsByID(t)[12]; st.Packets != before+1 {
		t.Fatalf("rule 12 copied %d, want %d", st.Packets, before+1)
	}
	// A decoder reads the ERSPAN II copy as such.
	h.lab.capture["up0"].drain(t)
	h.run(t, h.k.VifProgram(), ssh.bytes(t))
	if b, _ = h.lab.capture["up0"].next(2e9); b == nil {
		t.Fatal("no erspan2 copy")
	}
	pkt := gopacket.NewPacket(b, layers.LayerTypeEthernet, gopacket.Default)
	er, ok := pkt.Layer(layers.LayerTypeERSPANII).(*layers.ERSPANII)
	if !ok {
		t.Fatalf("gopacket finds no ERSPAN II in %x: %v", b, pkt)
	}
	inner := gopacket.NewPacket(er.Payload, layers.LayerTypeEthernet, gopacket.Default)
	ip4, _ := inner.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	tcpL, _ := inner.Layer(layers.LayerTypeTCP).(*layers.TCP)
	if er.Version != 1 || er.SessionID != 11 || ip4 == nil || ip4.SrcIP.String() != web1.String() || tcpL == nil || tcpL.DstPort != 22 {
		t.Fatalf("decoded ERSPAN II: version %d session %d, inner %v", er.Version, er.SessionID, inner)
	}
}

func TestEncapHeaderRefusesWhatItCannotWrite(t *testing.T) {
	if _, _, err := tapwire.EncapHeader("vxlan", 1, h1MAC, colMAC, hostAddr["h1"], colAddr); err == nil || !bytes.Contains([]byte(err.Error()), []byte(`unknown encapsulation "vxlan"`)) {
		t.Fatalf("vxlan: %v", err)
	}
	if _, _, err := tapwire.EncapHeader("gre", 1, h1MAC, colMAC, netip.MustParseAddr("::1"), colAddr); err == nil {
		t.Fatal("an IPv6 source was taken")
	}
}
