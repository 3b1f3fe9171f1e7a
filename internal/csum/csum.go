// Package csum computes the Internet checksum (RFC 1071) over packet bytes:
// of a whole buffer, of an IPv4 header, and of a TCP or UDP segment with
// its pseudo-header. It is pure, for the slow path that builds or mends
// frames (DHCP replies, released ARP holds, the xTR's SYNs) and for tests
// that check what the datapath wrote. bpf/lib/csum.h is its C twin.
package csum

import "encoding/binary"

// Sum adds b to sum, a one's-complement sum of 16-bit big-endian words
// (an odd last byte is padded with zero), and returns the new sum, carries
// folded in. Sums of separate pieces add up as Sum(Sum(0, a), b) as long as
// every piece but the last has an even length.
func Sum(sum uint16, b []byte) uint16 {
	s := uint32(sum)
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// Checksum is the Internet checksum of b: the complement of its Sum. A
// buffer whose checksum field is zero gets the value to write there; one
// that carries a correct checksum gives 0.
func Checksum(b []byte) uint16 {
	return ^Sum(0, b)
}

// SetIPv4 writes the header checksum of the IPv4 header at the start of h
// (as long as its IHL says), whatever its checksum field held before.
func SetIPv4(h []byte) {
	hl := int(h[0]&0x0f) * 4
	h[10], h[11] = 0, 0
	binary.BigEndian.PutUint16(h[10:], Checksum(h[:hl]))
}

// Pseudo is the Sum of the pseudo-header a TCP or UDP checksum covers
// (RFC 793 §3.1, RFC 768; RFC 8200 §8.1 for IPv6): source and destination
// addresses (4 or 16 bytes each), the protocol and the segment's length.
// The two families' layouts differ but add up the same way.
func Pseudo(src, dst []byte, proto uint8, length int) uint16 {
	s := Sum(Sum(0, src), dst)
	return Sum(s, []byte{byte(length >> 24), byte(length >> 16), byte(length >> 8), byte(length), 0, proto})
}

// Transport is the checksum to write into TCP or UDP segment seg (its
// checksum field zero) sent from src to dst. UDP sends a computed 0 as
// 0xffff: its 0 means "no checksum" (RFC 768).
func Transport(src, dst []byte, proto uint8, seg []byte) uint16 {
	c := ^Sum(Pseudo(src, dst, proto, len(seg)), seg)
	if c == 0 && proto == ProtoUDP {
		c = 0xffff
	}
	return c
}

// IP protocol numbers whose checksums cover a pseudo-header.
const (
	ProtoTCP = 6
	ProtoUDP = 17
)
