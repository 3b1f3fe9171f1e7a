// Package tapwire is the wire format of TAP copies to a collector
// (docs/tap.md): the outer headers the datapath puts before a copy (GRE,
// ERSPAN type II or III, or plain GRE), built for the agent to hand the
// datapath, and read back by the controller's capture; and the pcap
// stream a capture is written as. Pure: no kernel, no store.
package tapwire

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/onehop/onehop/internal/csum"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/tappolicy"
)

// Outer header lengths, outer Ethernet included (TAP_ENCAP_*_LEN in
// bpf/lib/tap_maps.h), and the template's size (TAP_ENCAP_MAX).
const (
	HeaderMax  = 72
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
func EncapHeader(encap string, session uint16, srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr) ([HeaderMax]byte, int, error) {
	var h [HeaderMax]byte
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

// Decap reads a copy as a collector receives it, from its GRE header on
// (what a raw IPv4 socket for protocol 47 reads): the copied Ethernet
// frame, and its ERSPAN session (0 for plain GRE). ok is false for GRE
// that is no copy of the kinds EncapHeader writes.
func Decap(gre []byte) (frame []byte, session uint16, ok bool) {
	if len(gre) < 4 {
		return nil, 0, false
	}
	flags, proto := binary.BigEndian.Uint16(gre[0:]), binary.BigEndian.Uint16(gre[2:])
	if flags&0x0007 != 0 { // GRE version 0 only
		return nil, 0, false
	}
	n := 4
	for _, bit := range []uint16{0x8000, 0x2000, 0x1000} { // checksum, key, sequence
		if flags&bit != 0 {
			n += 4
		}
	}
	if len(gre) < n {
		return nil, 0, false
	}
	rest := gre[n:]
	switch proto {
	case ProtoTEB:
		return rest, 0, len(rest) >= 14
	case ProtoERSPAN2, ProtoERSPAN3:
		hl, ver := 8, uint32(1)
		if proto == ProtoERSPAN3 {
			hl, ver = 12, 2
		}
		if len(rest) < hl {
			return nil, 0, false
		}
		w0 := binary.BigEndian.Uint32(rest)
		if w0>>28 != ver {
			return nil, 0, false
		}
		if proto == ProtoERSPAN3 && binary.BigEndian.Uint32(rest[8:])&1 != 0 { // O: a platform subheader follows
			hl += 8
		}
		if len(rest) < hl+14 {
			return nil, 0, false
		}
		return rest[hl:], uint16(w0 & 0x3ff), true
	}
	return nil, 0, false
}
