package tap

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/onehop/onehop/internal/csum"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/tappolicy"
)

// Encapsulations of copies to a collector (enum tap_encap in
// bpf/lib/tap_maps.h), by the names policies give them.
var encapKinds = map[string]uint8{
	tappolicy.EncapGRE:     uint8(tapTapEncapTAP_ENCAP_GRE),
	tappolicy.EncapERSPAN2: uint8(tapTapEncapTAP_ENCAP_ERSPAN2),
	tappolicy.EncapERSPAN3: uint8(tapTapEncapTAP_ENCAP_ERSPAN3),
}

// Outer header lengths, outer Ethernet included (TAP_ENCAP_*_LEN).
const (
	GRELen     = 14 + 20 + 4
	ERSPAN2Len = 14 + 20 + 8 + 8
	ERSPAN3Len = 14 + 20 + 8 + 12
)

// EtherTypes a collector's GRE header carries.
const (
	ProtoERSPAN2 = 0x88be
	ProtoERSPAN3 = 0x22eb
	ProtoTEB     = 0x6558 // transparent Ethernet bridging: plain GRE with the frame
)

// Session is the ERSPAN session of a rule's copies: its policy's id (both
// directions, and a capture of it, share it). ERSPAN has 10 bits; the
// controller gives policies ids 1..128.
func Session(ruleID uint32) uint16 {
	return uint16(ruleID &^ (intent.TapReverse | intent.TapCapture) & 0x3ff)
}

func (c collectorTarget) String() string {
	if c.addr == "" {
		return ""
	}
	return fmt.Sprintf("%s/%s/%d/%s/%s", c.addr, c.encap, c.session, c.mac, c.src)
}

// EncapHeader is the outer headers of a copy to a collector, as the
// datapath puts them before the frame (tap_target.hdr), and the inner
// frame's EtherType (IPv4) after them: Ethernet from the
// uplink's MAC to the collector's; IPv4 from src to dst, protocol GRE,
// don't fragment, TTL 64, total length 0 and the checksum over that (the
// datapath adds the length to both); GRE; and the ERSPAN header with the
// session, its sequence number and timestamp 0 (the datapath fills them).
// ERSPAN II: version 1, no VLAN, COS 0, En 0, T 0, index 0. ERSPAN III:
// version 2, granularity 100 ns (Gra 01), frame type Ethernet, no
// optional subheader. It returns the header's length.
func EncapHeader(encap string, session uint16, srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr) ([72]byte, int, error) {
	var h [72]byte
	var n int
	var proto uint16
	switch encap {
	case tappolicy.EncapGRE:
		n, proto = GRELen, ProtoTEB
	case tappolicy.EncapERSPAN2:
		n, proto = ERSPAN2Len, ProtoERSPAN2
	case tappolicy.EncapERSPAN3:
		n, proto = ERSPAN3Len, ProtoERSPAN3
	default:
		return h, 0, fmt.Errorf("unknown encapsulation %q: want %s, %s or %s", encap, tappolicy.EncapERSPAN2, tappolicy.EncapERSPAN3, tappolicy.EncapGRE)
	}
	if len(srcMAC) != 6 || len(dstMAC) != 6 || !src.Is4() || !dst.Is4() {
		return h, 0, fmt.Errorf("encapsulation %s: want Ethernet MACs and IPv4 addresses, have %s %s %s %s", encap, srcMAC, dstMAC, src, dst)
	}
	copy(h[0:6], dstMAC)
	copy(h[6:12], srcMAC)
	binary.BigEndian.PutUint16(h[12:], 0x0800)
	ip := h[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // don't fragment
	ip[8] = 64
	ip[9] = 47 // GRE
	s4, d4 := src.As4(), dst.As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	csum.SetIPv4(ip)
	gre := h[34:]
	binary.BigEndian.PutUint16(gre[2:], proto)
	binary.BigEndian.PutUint16(h[n+12:], 0x0800) // the inner frame's EtherType
	if encap == tappolicy.EncapGRE {
		return h, n, nil
	}
	binary.BigEndian.PutUint16(gre[0:], 0x1000) // S: a sequence number follows
	er := gre[8:]
	sess := uint32(session & 0x3ff)
	if encap == tappolicy.EncapERSPAN2 {
		binary.BigEndian.PutUint32(er[0:], 1<<28|sess)
		return h, n, nil
	}
	binary.BigEndian.PutUint32(er[0:], 2<<28|sess)
	binary.BigEndian.PutUint32(er[8:], 1<<1) // Gra 01: 100 ns; FT 0: Ethernet; O 0
	return h, n, nil
}
