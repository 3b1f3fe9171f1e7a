// Package bpftest is for tests only (only _test.go files import it): what
// the BPF_PROG_RUN tables of the datapath's packages share, so that each
// feature's tests say what a frame must do and nothing else. It gives a
// frame builder (Frame, MustMAC), the verdicts a tc program returns, the
// redirect log the test objects keep (bpf/lib/redirect.h, built with
// ONEHOP_TEST_HOOKS), one run of a program with what it redirected and
// cloned (Run), a table runner for rows of {name, frame in, verdict,
// target, copies, frame out, counter deltas} (RunTable), the check of
// counter deltas for tables that run their own way (CheckDelta), and the
// per-packet cost the benchmarks report (PacketCost).
package bpftest

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/csum"
)

// Frame is an Ethernet frame to build for a test run, every checksum
// right. A field left zero is zero in the frame, except where its comment
// says what it defaults to; a package whose rows lean on other defaults
// (ports, echo ids) fills them in before Bytes.
type Frame struct {
	Src, Dst  net.HardwareAddr    // nil: 00:00:00:00:00:00 (lo's header)
	EtherType layers.EthernetType // 0: ARP if ARPOp is set, IPv4 if not
	VLAN      uint16              // not 0: an 802.1Q tag with this VLAN id before EtherType

	// IPv4 (and the ARP addresses).
	Saddr, Daddr  netip.Addr
	Proto         layers.IPProtocol
	TTL           uint8 // 0: 64
	IPID          uint16
	MoreFragments bool   // the MF flag: a fragment with more to come
	Reserved      bool   // the reserved flag (RFC 3514's evil bit): the TAP's copy marker
	FragOffset    uint16 // in 8-byte units
	// IHL 0 is 5; 6 adds one word of options (three NOPs and an end of
	// list); any other value is written into the header as it is, without
	// the words it promises (malformed rows).
	IHL uint8

	// TCP (a SYN, window 1000) and UDP.
	Sport, Dport uint16
	// ACK makes the TCP segment a SYN-ACK (a server's answer).
	ACK bool

	// ICMPv4 (sequence 1). ICMPID is the echo id, or the unused word of an
	// error.
	ICMPType, ICMPCode uint8
	ICMPID             uint16
	// Quote is the packet an ICMP error quotes: its IPv4 header and first
	// 8 bytes after it take the place of Payload.
	Quote *Frame

	// ARP: sender and target protocol addresses are Saddr and Daddr.
	ARPOp  uint16
	ARPSHA net.HardwareAddr // nil: Src
	ARPTHA net.HardwareAddr // nil: 00:00:00:00:00:00

	// Payload follows the TCP, UDP or ICMP header (or the IPv4 header for
	// another protocol, the IPv6 header for IPv6); nil: 32 bytes of 0xab.
	Payload []byte

	// CutL4 > 0 keeps only this many bytes after the IPv4 header (its
	// total length and checksum follow); Truncate > 0 then cuts the whole
	// frame to this many bytes (lengths unchanged).
	CutL4    int
	Truncate int
}

// Bytes builds the frame, failing t if gopacket cannot.
func (f Frame) Bytes(t testing.TB) []byte {
	t.Helper()
	src, dst := orZeroMAC(f.Src), orZeroMAC(f.Dst)
	etype := f.EtherType
	switch {
	case etype != 0:
	case f.ARPOp != 0:
		etype = layers.EthernetTypeARP
	default:
		etype = layers.EthernetTypeIPv4
	}
	eth := &layers.Ethernet{SrcMAC: src, DstMAC: dst, EthernetType: etype}
	ls := []gopacket.SerializableLayer{eth}
	l3 := 14
	if f.VLAN != 0 {
		eth.EthernetType = layers.EthernetTypeDot1Q
		ls = append(ls, &layers.Dot1Q{VLANIdentifier: f.VLAN, Type: etype})
		l3 += 4
	}
	payload := gopacket.Payload(bytes.Repeat([]byte{0xab}, 32))
	if f.Payload != nil {
		payload = f.Payload
	}
	switch etype {
	case layers.EthernetTypeARP:
		sha := f.ARPSHA
		if sha == nil {
			sha = src
		}
		ls = append(ls, &layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4,
			HwAddressSize: 6, ProtAddressSize: 4, Operation: f.ARPOp,
			SourceHwAddress: sha, SourceProtAddress: f.Saddr.AsSlice(),
			DstHwAddress: orZeroMAC(f.ARPTHA), DstProtAddress: f.Daddr.AsSlice()})
	case layers.EthernetTypeIPv6:
		ls = append(ls, &layers.IPv6{Version: 6, NextHeader: layers.IPProtocolUDP, HopLimit: 64,
			SrcIP: net.ParseIP("fd00::1"), DstIP: net.ParseIP("fd00::2")}, payload)
	default:
		ip := &layers.IPv4{Version: 4, TTL: f.TTL, Protocol: f.Proto, SrcIP: f.Saddr.AsSlice(), DstIP: f.Daddr.AsSlice(),
			Id: f.IPID, FragOffset: f.FragOffset}
		if ip.TTL == 0 {
			ip.TTL = 64
		}
		if f.MoreFragments {
			ip.Flags |= layers.IPv4MoreFragments
		}
		if f.Reserved {
			ip.Flags |= layers.IPv4EvilBit
		}
		if f.IHL == 6 {
			ip.Options = []layers.IPv4Option{{OptionType: 1}, {OptionType: 1}, {OptionType: 1}, {OptionType: 0}}
		}
		ls = append(ls, ip)
		switch f.Proto {
		case layers.IPProtocolTCP:
			tcp := &layers.TCP{SrcPort: layers.TCPPort(f.Sport), DstPort: layers.TCPPort(f.Dport), SYN: true, ACK: f.ACK, Window: 1000}
			tcp.SetNetworkLayerForChecksum(ip)
			ls = append(ls, tcp, payload)
		case layers.IPProtocolUDP:
			udp := &layers.UDP{SrcPort: layers.UDPPort(f.Sport), DstPort: layers.UDPPort(f.Dport)}
			udp.SetNetworkLayerForChecksum(ip)
			ls = append(ls, udp, payload)
		case layers.IPProtocolICMPv4:
			icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(f.ICMPType, f.ICMPCode), Id: f.ICMPID, Seq: 1}
			if f.Quote != nil {
				q := f.Quote.Bytes(t)[14:]
				hl := int(q[0]&0x0f) * 4
				ls = append(ls, icmp, gopacket.Payload(q[:hl+8]))
			} else {
				ls = append(ls, icmp, payload)
			}
		default:
			ls = append(ls, payload)
		}
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		t.Fatalf("build frame: %v", err)
	}
	b := append([]byte(nil), buf.Bytes()...)
	if f.IHL != 0 && f.IHL != 6 {
		b[l3] = 0x40 | f.IHL
	}
	if f.CutL4 > 0 {
		hl := int(b[l3]&0x0f) * 4
		b = b[:l3+hl+f.CutL4]
		binary.BigEndian.PutUint16(b[l3+2:l3+4], uint16(hl+f.CutL4))
		csum.SetIPv4(b[l3:])
	}
	if f.Truncate > 0 {
		b = b[:f.Truncate]
	}
	return b
}

func orZeroMAC(m net.HardwareAddr) net.HardwareAddr {
	if m == nil {
		return make(net.HardwareAddr, 6)
	}
	return m
}

// MustMAC parses a MAC address a test writes as a literal, panicking on a
// typo.
func MustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}
