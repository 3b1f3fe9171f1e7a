package lisp

import (
	"encoding/binary"
	"fmt"
)

// DataHeaderLen is the size of the LISP header between the outer UDP header
// and the inner IP packet (RFC 9300 §5.3).
const DataHeaderLen = 8

// DataHeader is the 8-byte header of an encapsulated packet (RFC 9300 §5.3):
//
//	byte 0: N L E V I R K K (flags, most significant first)
//	bytes 1-3: Nonce (24 bits) when N; Source Map-Version (12) and Dest
//	           Map-Version (12) when V; otherwise zero
//	bytes 4-7: Instance ID (24 bits) and the low 8 Locator-Status-Bits when
//	           I; otherwise the 32 Locator-Status-Bits
type DataHeader struct {
	NonceValid       bool   // N
	LSBValid         bool   // L: the Locator-Status-Bits are meaningful
	EchoNonce        bool   // E: echo-nonce request (only with N)
	MapVersioned     bool   // V
	InstanceIDValid  bool   // I
	KeyBits          uint8  // KK (RFC 8061): 0 = not encrypted
	Nonce            uint32 // 24 bits
	SourceMapVersion uint16 // 12 bits
	DestMapVersion   uint16 // 12 bits
	InstanceID       uint32 // 24 bits
	LSB              uint32 // 32 bits, or 8 when InstanceIDValid
}

const (
	dataN = 0x80
	dataL = 0x40
	dataE = 0x20
	dataV = 0x10
	dataI = 0x08
	dataR = 0x04 // reserved: sent as 0, ignored on receipt
)

// Validate checks the combinations RFC 9300 forbids and the field widths.
func (h DataHeader) Validate() error {
	switch {
	case h.NonceValid && h.MapVersioned:
		return fmt.Errorf("lisp data header: N and V both set: the nonce and the map versions share bytes 1-3")
	case h.EchoNonce && !h.NonceValid:
		return fmt.Errorf("lisp data header: E (echo-nonce request) without N")
	case h.Nonce > 0xffffff:
		return fmt.Errorf("lisp data header: nonce %#x: over 24 bits", h.Nonce)
	case !h.NonceValid && h.Nonce != 0:
		return fmt.Errorf("lisp data header: a nonce without N")
	case h.SourceMapVersion > 0xfff || h.DestMapVersion > 0xfff:
		return fmt.Errorf("lisp data header: map versions %d/%d: over 12 bits", h.SourceMapVersion, h.DestMapVersion)
	case !h.MapVersioned && (h.SourceMapVersion != 0 || h.DestMapVersion != 0):
		return fmt.Errorf("lisp data header: map versions without V")
	case h.InstanceID > 0xffffff:
		return fmt.Errorf("lisp data header: instance id %d: over 24 bits", h.InstanceID)
	case !h.InstanceIDValid && h.InstanceID != 0:
		return fmt.Errorf("lisp data header: an instance id without I")
	case h.InstanceIDValid && h.LSB > 0xff:
		return fmt.Errorf("lisp data header: with I, only 8 locator-status-bits fit (got %#x)", h.LSB)
	case !h.LSBValid && h.LSB != 0:
		return fmt.Errorf("lisp data header: locator-status-bits without L")
	case h.KeyBits > 3:
		return fmt.Errorf("lisp data header: key bits %d: over 2 bits", h.KeyBits)
	}
	return nil
}

// Marshal returns the header's 8 bytes.
func (h DataHeader) Marshal() ([DataHeaderLen]byte, error) {
	var b [DataHeaderLen]byte
	if err := h.Validate(); err != nil {
		return b, err
	}
	for _, f := range []struct {
		on  bool
		bit uint8
	}{{h.NonceValid, dataN}, {h.LSBValid, dataL}, {h.EchoNonce, dataE}, {h.MapVersioned, dataV}, {h.InstanceIDValid, dataI}} {
		if f.on {
			b[0] |= f.bit
		}
	}
	b[0] |= h.KeyBits
	var mid uint32
	if h.NonceValid {
		mid = h.Nonce
	} else if h.MapVersioned {
		mid = uint32(h.SourceMapVersion)<<12 | uint32(h.DestMapVersion)
	}
	b[1], b[2], b[3] = byte(mid>>16), byte(mid>>8), byte(mid)
	last := h.LSB
	if h.InstanceIDValid {
		last = h.InstanceID<<8 | h.LSB
	}
	binary.BigEndian.PutUint32(b[4:], last)
	return b, nil
}

// ParseDataHeader reads the first 8 bytes of b. Following RFC 9300 §5.3, a
// header with both N and V is read as carrying a nonce, E without N is
// ignored, and bytes 1-3 without N or V are ignored; the R bit is ignored.
func ParseDataHeader(b []byte) (DataHeader, error) {
	var h DataHeader
	if len(b) < DataHeaderLen {
		return h, &Error{Message: "data header", Field: "header", Offset: len(b),
			Reason: fmt.Sprintf("truncated: %d bytes, want %d", len(b), DataHeaderLen)}
	}
	f := b[0]
	mid := uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	h.NonceValid, h.LSBValid, h.InstanceIDValid = f&dataN != 0, f&dataL != 0, f&dataI != 0
	h.KeyBits = f & 0x03
	switch {
	case h.NonceValid:
		h.Nonce = mid
		h.EchoNonce = f&dataE != 0
	case f&dataV != 0:
		h.MapVersioned = true
		h.SourceMapVersion, h.DestMapVersion = uint16(mid>>12), uint16(mid&0xfff)
	}
	last := binary.BigEndian.Uint32(b[4:])
	if h.InstanceIDValid {
		h.InstanceID, last = last>>8, last&0xff
	}
	if h.LSBValid {
		h.LSB = last
	}
	return h, nil
}

// ParseDataPacket splits the UDP payload of a LISP data packet into its
// header and the inner IP packet, which must be IPv4 or IPv6 and hold at
// least that version's header.
func ParseDataPacket(b []byte) (DataHeader, []byte, error) {
	h, err := ParseDataHeader(b)
	if err != nil {
		return h, nil, err
	}
	inner := b[DataHeaderLen:]
	if len(inner) == 0 {
		return h, nil, &Error{Message: "data packet", Field: "inner header", Offset: DataHeaderLen, Reason: "no inner packet"}
	}
	want := 0
	switch v := inner[0] >> 4; v {
	case 4:
		want = 20
	case 6:
		want = 40
	default:
		return h, nil, &Error{Message: "data packet", Field: "inner ip version", Offset: DataHeaderLen,
			Reason: fmt.Sprintf("version %d: want 4 or 6", v)}
	}
	if len(inner) < want {
		return h, nil, &Error{Message: "data packet", Field: "inner header", Offset: len(b),
			Reason: fmt.Sprintf("truncated: %d bytes of inner IPv%d header, want %d", len(inner), inner[0]>>4, want)}
	}
	return h, inner, nil
}
