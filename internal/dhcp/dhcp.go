// Package dhcp is the DHCP server a host answers its own VMs with (paper §2,
// "Virtual DHCP"): pure message parsing and reply building (RFC 2131/2132),
// no sockets. Every VM already has its address; DHCP only tells it.
package dhcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// Message types (option 53).
const (
	Discover = 1
	Offer    = 2
	Request  = 3
	Decline  = 4
	Ack      = 5
	Nak      = 6
	Release  = 7
	Inform   = 8
)

const (
	opRequest     = 1
	opReply       = 2
	fixedLen      = 236
	magic         = 0x63825363
	optPad        = 0
	optSubnetMask = 1
	optRouter     = 3
	optDNS        = 6
	optRequested  = 50
	optLease      = 51
	optMsgType    = 53
	optServerID   = 54
	optParamList  = 55
	optEnd        = 255
	flagBroadcast = 0x8000
)

// Message is the part of a DHCP message the server needs.
type Message struct {
	Op        uint8
	XID       uint32
	Flags     uint16
	CIAddr    netip.Addr
	CHAddr    net.HardwareAddr
	Type      uint8
	Requested netip.Addr // option 50
	ServerID  netip.Addr // option 54
}

// Parse decodes a DHCP message (the UDP payload), rejecting anything that is
// not a well-formed Ethernet-client request with a message type.
func Parse(b []byte) (*Message, error) {
	if len(b) < fixedLen+4 {
		return nil, fmt.Errorf("dhcp: %d bytes, shorter than a DHCP header", len(b))
	}
	if binary.BigEndian.Uint32(b[fixedLen:]) != magic {
		return nil, errors.New("dhcp: no magic cookie (BOOTP without DHCP options)")
	}
	if b[1] != 1 || b[2] != 6 {
		return nil, fmt.Errorf("dhcp: hardware type %d length %d, want Ethernet (1, 6)", b[1], b[2])
	}
	m := &Message{
		Op:     b[0],
		XID:    binary.BigEndian.Uint32(b[4:]),
		Flags:  binary.BigEndian.Uint16(b[10:]),
		CIAddr: netip.AddrFrom4([4]byte(b[12:16])),
		CHAddr: net.HardwareAddr(append([]byte(nil), b[28:34]...)),
	}
	opts := b[fixedLen+4:]
	for i := 0; i < len(opts); {
		code := opts[i]
		if code == optEnd {
			break
		}
		if code == optPad {
			i++
			continue
		}
		if i+1 >= len(opts) || i+2+int(opts[i+1]) > len(opts) {
			return nil, fmt.Errorf("dhcp: option %d at offset %d runs past the message", code, fixedLen+4+i)
		}
		val := opts[i+2 : i+2+int(opts[i+1])]
		switch code {
		case optMsgType:
			if len(val) == 1 {
				m.Type = val[0]
			}
		case optRequested:
			if len(val) == 4 {
				m.Requested = netip.AddrFrom4([4]byte(val))
			}
		case optServerID:
			if len(val) == 4 {
				m.ServerID = netip.AddrFrom4([4]byte(val))
			}
		}
		i += 2 + len(val)
	}
	if m.Op != opRequest {
		return nil, errors.New("dhcp: not a client request (op != BOOTREQUEST)")
	}
	if m.Type == 0 {
		return nil, errors.New("dhcp: no message type option")
	}
	return m, nil
}

// Lease is what a VM is told.
type Lease struct {
	IP      netip.Addr
	Mask    netip.Addr
	Gateway netip.Addr // also the server identifier: the VM's own gateway answers
	DNS     []netip.Addr
	Time    time.Duration
}

// Reply returns the reply to m for a VM whose lease is l, or nil when the
// message needs none (release, decline, a request meant for another server).
func Reply(m *Message, l Lease) ([]byte, uint8) {
	var typ uint8
	yiaddr := l.IP
	switch m.Type {
	case Discover:
		typ = Offer
	case Request:
		if m.ServerID.IsValid() && m.ServerID != l.Gateway {
			return nil, 0 // the client chose another server's offer
		}
		want := m.Requested
		if !want.IsValid() {
			want = m.CIAddr
		}
		typ = Ack
		if want != l.IP {
			typ = Nak // it asks for an address it does not own
		}
	case Inform:
		typ, yiaddr = Ack, netip.IPv4Unspecified()
	default:
		return nil, 0
	}
	b := make([]byte, fixedLen+4, 300)
	b[0], b[1], b[2] = opReply, 1, 6
	binary.BigEndian.PutUint32(b[4:], m.XID)
	binary.BigEndian.PutUint16(b[10:], m.Flags&flagBroadcast)
	copy(b[12:16], m.CIAddr.AsSlice())
	if typ != Nak {
		copy(b[16:20], yiaddr.AsSlice())
	}
	copy(b[20:24], l.Gateway.AsSlice())
	copy(b[28:34], m.CHAddr)
	binary.BigEndian.PutUint32(b[fixedLen:], magic)
	opt := func(code byte, val []byte) { b = append(append(b, code, byte(len(val))), val...) }
	opt(optMsgType, []byte{typ})
	opt(optServerID, l.Gateway.AsSlice())
	if typ != Nak {
		if typ != Ack || m.Type != Inform {
			secs := make([]byte, 4)
			binary.BigEndian.PutUint32(secs, uint32(l.Time/time.Second))
			opt(optLease, secs)
		}
		opt(optSubnetMask, l.Mask.AsSlice())
		opt(optRouter, l.Gateway.AsSlice())
		if len(l.DNS) > 0 {
			var dns []byte
			for _, d := range l.DNS {
				dns = append(dns, d.AsSlice()...)
			}
			opt(optDNS, dns)
		}
	}
	b = append(b, optEnd)
	for len(b) < 300 { // BOOTP minimum; some clients insist
		b = append(b, optPad)
	}
	return b, typ
}
