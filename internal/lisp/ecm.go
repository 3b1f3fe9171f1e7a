package lisp

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/onehop/onehop/internal/csum"
)

// ECM is an Encapsulated Control Message (RFC 9301 §5.8): how an ITR sends
// a Map-Request to a map-resolver. After the 4-byte LISP header come an
// inner IPv4 or IPv6 header and a UDP header (source: the ITR's RLOC and
// port the Map-Reply goes to; destination: the EID asked for, port 4342),
// then the control message.
//
//	byte 0: Type=8 (bits 0-3), S 0x08, D 0x04, E 0x02, M 0x01; bytes 1-3 reserved
type ECM struct {
	Security bool // S: LISP-SEC (refused: not supported)
	DDT      bool // D: sent by a DDT node
	ToETR    bool // E: forwarded by a map-server to an ETR
	ToMS     bool // M: sent to a map-server
	Source   netip.AddrPort
	Dest     netip.AddrPort
	Message  []byte // the inner control message
}

const (
	ecmS = 0x08
	ecmD = 0x04
	ecmE = 0x02
	ecmM = 0x01
)

// Encode writes the ECM with an inner IPv4 or IPv6 header (TTL 64) and a
// UDP header whose checksum is 0 for IPv4 (RFC 768 allows it) and computed
// for IPv6.
func (e *ECM) Encode() ([]byte, error) {
	if e.Security {
		return nil, fmt.Errorf("ecm: the S bit (LISP-SEC) is not supported")
	}
	src, dst := e.Source.Addr(), e.Dest.Addr()
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() || src.Is4In6() || dst.Is4In6() {
		return nil, fmt.Errorf("ecm: inner addresses %s and %s: want two IPv4 or two IPv6 addresses", src, dst)
	}
	udpLen := 8 + len(e.Message)
	b := []byte{uint8(TypeECM) << 4, 0, 0, 0}
	for _, f := range []struct {
		on  bool
		bit uint8
	}{{e.DDT, ecmD}, {e.ToETR, ecmE}, {e.ToMS, ecmM}} {
		if f.on {
			b[0] |= f.bit
		}
	}
	if src.Is4() {
		if 20+udpLen > 0xffff {
			return nil, fmt.Errorf("ecm: %d-byte message: too long for IPv4", len(e.Message))
		}
		ip := make([]byte, 20)
		ip[0], ip[8], ip[9] = 0x45, 64, 17
		binary.BigEndian.PutUint16(ip[2:], uint16(20+udpLen))
		s4, d4 := src.As4(), dst.As4()
		copy(ip[12:], s4[:])
		copy(ip[16:], d4[:])
		csum.SetIPv4(ip)
		b = append(b, ip...)
	} else {
		ip := make([]byte, 40)
		ip[0], ip[6], ip[7] = 0x60, 17, 64
		binary.BigEndian.PutUint16(ip[4:], uint16(udpLen))
		s16, d16 := src.As16(), dst.As16()
		copy(ip[8:], s16[:])
		copy(ip[24:], d16[:])
		b = append(b, ip...)
	}
	udp := make([]byte, 8, udpLen)
	binary.BigEndian.PutUint16(udp[0:], e.Source.Port())
	binary.BigEndian.PutUint16(udp[2:], e.Dest.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen))
	udp = append(udp, e.Message...)
	if src.Is6() {
		s16, d16 := src.As16(), dst.As16()
		binary.BigEndian.PutUint16(udp[6:], csum.Transport(s16[:], d16[:], csum.ProtoUDP, udp))
	}
	b = append(b, udp...)
	if len(b) > MaxMessageLen {
		return nil, fmt.Errorf("ecm: %d bytes: over the %d-byte limit", len(b), MaxMessageLen)
	}
	return b, nil
}

// DecodeECM reads an ECM: its flags, the inner IP and UDP headers (which
// must be consistent: UDP, lengths matching the message) and the control
// message it carries, which it does not decode.
func DecodeECM(b []byte) (ECM, error) {
	var e ECM
	r, w, err := header(b, "ecm", TypeECM)
	if err != nil {
		return e, err
	}
	f := uint8(w >> 24)
	e.Security, e.DDT, e.ToETR, e.ToMS = f&ecmS != 0, f&ecmD != 0, f&ecmE != 0, f&ecmM != 0
	if e.Security {
		return ECM{}, r.fail("s bit", 0, "LISP-SEC (S bit) is not supported")
	}
	ipAt := r.off
	if err := r.need(1, "inner ip version"); err != nil {
		return ECM{}, err
	}
	var src, dst netip.Addr
	var rest int // bytes the IP header says follow it
	switch v := b[ipAt] >> 4; v {
	case 4:
		if err := r.need(20, "inner ipv4 header"); err != nil {
			return ECM{}, err
		}
		ihl := int(b[ipAt]&0x0f) * 4
		if ihl < 20 {
			return ECM{}, r.fail("inner ipv4 ihl", ipAt, "header length %d: want at least 20", ihl)
		}
		if err := r.need(ihl, "inner ipv4 options"); err != nil {
			return ECM{}, err
		}
		if p := b[ipAt+9]; p != 17 {
			return ECM{}, r.fail("inner ipv4 protocol", ipAt+9, "protocol %d: want 17 (UDP)", p)
		}
		total := int(binary.BigEndian.Uint16(b[ipAt+2:]))
		if total != len(b)-ipAt {
			return ECM{}, r.fail("inner ipv4 total length", ipAt+2, "%d, but %d bytes follow the LISP header", total, len(b)-ipAt)
		}
		src, dst = netip.AddrFrom4([4]byte(b[ipAt+12:])), netip.AddrFrom4([4]byte(b[ipAt+16:]))
		r.off += ihl
		rest = total - ihl
	case 6:
		if err := r.need(40, "inner ipv6 header"); err != nil {
			return ECM{}, err
		}
		if nh := b[ipAt+6]; nh != 17 {
			return ECM{}, r.fail("inner ipv6 next header", ipAt+6, "next header %d: want 17 (UDP; extension headers are not supported)", nh)
		}
		rest = int(binary.BigEndian.Uint16(b[ipAt+4:]))
		if rest != len(b)-ipAt-40 {
			return ECM{}, r.fail("inner ipv6 payload length", ipAt+4, "%d, but %d bytes follow the IPv6 header", rest, len(b)-ipAt-40)
		}
		src, dst = netip.AddrFrom16([16]byte(b[ipAt+8:])), netip.AddrFrom16([16]byte(b[ipAt+24:]))
		r.off += 40
	default:
		return ECM{}, r.fail("inner ip version", ipAt, "version %d: want 4 or 6", v)
	}
	udpAt := r.off
	if err := r.need(8, "inner udp header"); err != nil {
		return ECM{}, err
	}
	sport, dport := binary.BigEndian.Uint16(b[udpAt:]), binary.BigEndian.Uint16(b[udpAt+2:])
	if ulen := int(binary.BigEndian.Uint16(b[udpAt+4:])); ulen != rest {
		return ECM{}, r.fail("inner udp length", udpAt+4, "%d, but the IP header leaves %d", ulen, rest)
	}
	r.off += 8
	if r.off == len(b) {
		return ECM{}, r.fail("inner message", r.off, "no control message")
	}
	e.Source, e.Dest = netip.AddrPortFrom(src, sport), netip.AddrPortFrom(dst, dport)
	e.Message = append([]byte(nil), b[r.off:]...)
	return e, nil
}
