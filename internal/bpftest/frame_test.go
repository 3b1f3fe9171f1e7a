package bpftest_test

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/csum"
)

// a and b are the addresses of every IPv4 frame built here.
var a, b = netip.MustParseAddr("10.1.1.2"), netip.MustParseAddr("10.1.1.3")

// decode parses a built frame with gopacket, failing on anything it
// cannot read.
func decode(t *testing.T, f bpftest.Frame) gopacket.Packet {
	t.Helper()
	p := gopacket.NewPacket(f.Bytes(t), layers.LayerTypeEthernet, gopacket.Default)
	if err := p.ErrorLayer(); err != nil {
		t.Fatalf("%+v does not decode: %v", f, err.Error())
	}
	return p
}

func TestAZeroFrameIsIPv4FromZeroMACsWithTTL64And32BytesOfPayload(t *testing.T) {
	p := decode(t, bpftest.Frame{Saddr: a, Daddr: b, Proto: layers.IPProtocol(47)})
	eth := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	if !bytes.Equal(eth.SrcMAC, make([]byte, 6)) || !bytes.Equal(eth.DstMAC, make([]byte, 6)) {
		t.Errorf("MACs %s -> %s, want zeros", eth.SrcMAC, eth.DstMAC)
	}
	if ip.TTL != 64 || ip.IHL != 5 || ip.Flags != 0 || !bytes.Equal(ip.Payload, bytes.Repeat([]byte{0xab}, 32)) {
		t.Errorf("TTL %d, IHL %d, flags %v, payload %x", ip.TTL, ip.IHL, ip.Flags, ip.Payload)
	}
	if csum.Checksum(ip.Contents) != 0 {
		t.Error("IPv4 header checksum does not verify")
	}
}

func TestFrameOptionsReachTheBytes(t *testing.T) {
	t.Run("an ARP op makes an ARP frame, the sender's MAC its source's", func(t *testing.T) {
		mac := bpftest.MustMAC("aa:00:00:00:00:01")
		arp := decode(t, bpftest.Frame{Src: mac, Saddr: a, Daddr: b, ARPOp: 1}).Layer(layers.LayerTypeARP).(*layers.ARP)
		if arp.Operation != 1 || !bytes.Equal(arp.SourceHwAddress, mac) || !bytes.Equal(arp.DstHwAddress, make([]byte, 6)) ||
			!bytes.Equal(arp.SourceProtAddress, a.AsSlice()) || !bytes.Equal(arp.DstProtAddress, b.AsSlice()) {
			t.Errorf("%+v", arp)
		}
	})
	t.Run("a VLAN id tags the frame", func(t *testing.T) {
		p := decode(t, bpftest.Frame{Saddr: a, Daddr: b, Proto: layers.IPProtocolUDP, VLAN: 10})
		tag, ok := p.Layer(layers.LayerTypeDot1Q).(*layers.Dot1Q)
		if !ok || tag.VLANIdentifier != 10 || p.Layer(layers.LayerTypeUDP) == nil {
			t.Errorf("tag %+v, layers %v", tag, p.Layers())
		}
	})
	t.Run("flags, fragment offset, id and TTL", func(t *testing.T) {
		ip := decode(t, bpftest.Frame{Saddr: a, Daddr: b, Proto: layers.IPProtocolUDP, MoreFragments: true, Reserved: true,
			FragOffset: 185, IPID: 9, TTL: 3}).Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if ip.Flags != layers.IPv4MoreFragments|layers.IPv4EvilBit || ip.FragOffset != 185 || ip.Id != 9 || ip.TTL != 3 {
			t.Errorf("%+v", ip)
		}
	})
	t.Run("IHL 6 is one word of options", func(t *testing.T) {
		ip := decode(t, bpftest.Frame{Saddr: a, Daddr: b, Proto: layers.IPProtocolTCP, IHL: 6}).Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if ip.IHL != 6 || csum.Checksum(ip.Contents) != 0 {
			t.Errorf("IHL %d, checksum %#04x", ip.IHL, csum.Checksum(ip.Contents))
		}
	})
	t.Run("another IHL is written as it is", func(t *testing.T) {
		if got := (bpftest.Frame{Saddr: a, Daddr: b, Proto: layers.IPProtocolUDP, IHL: 4}).Bytes(t)[14]; got != 0x44 {
			t.Errorf("version/IHL byte %#02x", got)
		}
	})
	t.Run("CutL4 keeps that much after the IPv4 header, lengths and checksum following", func(t *testing.T) {
		f := bpftest.Frame{Saddr: a, Daddr: b, Proto: layers.IPProtocolUDP, CutL4: 4}.Bytes(t)
		if len(f) != 14+20+4 || binary.BigEndian.Uint16(f[16:]) != 24 || csum.Checksum(f[14:34]) != 0 {
			t.Errorf("%x", f)
		}
	})
	t.Run("Truncate cuts the frame", func(t *testing.T) {
		if f := (bpftest.Frame{Saddr: a, Daddr: b, Proto: layers.IPProtocolUDP, Truncate: 30}).Bytes(t); len(f) != 30 {
			t.Errorf("%d bytes", len(f))
		}
	})
	t.Run("an ICMP error carries its quote's header and 8 bytes", func(t *testing.T) {
		q := bpftest.Frame{Saddr: b, Daddr: a, Proto: layers.IPProtocolUDP, Sport: 53, Dport: 10005}
		icmp := decode(t, bpftest.Frame{Saddr: a, Daddr: b, Proto: layers.IPProtocolICMPv4, ICMPType: 3, ICMPCode: 3, Quote: &q}).
			Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
		if icmp.TypeCode != layers.CreateICMPv4TypeCode(3, 3) || !bytes.Equal(icmp.Payload, q.Bytes(t)[14:14+28]) {
			t.Errorf("%v quoting %x", icmp.TypeCode, icmp.Payload)
		}
	})
	t.Run("TCP and UDP ports, ICMP echo id", func(t *testing.T) {
		tcp := decode(t, bpftest.Frame{Saddr: a, Daddr: b, Proto: layers.IPProtocolTCP, Sport: 1, Dport: 2}).Layer(layers.LayerTypeTCP).(*layers.TCP)
		udp := decode(t, bpftest.Frame{Saddr: a, Daddr: b, Proto: layers.IPProtocolUDP, Sport: 3, Dport: 4}).Layer(layers.LayerTypeUDP).(*layers.UDP)
		icmp := decode(t, bpftest.Frame{Saddr: a, Daddr: b, Proto: layers.IPProtocolICMPv4, ICMPType: 8, ICMPID: 5}).Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
		if tcp.SrcPort != 1 || tcp.DstPort != 2 || !tcp.SYN || udp.SrcPort != 3 || udp.DstPort != 4 || icmp.Id != 5 || icmp.Seq != 1 {
			t.Errorf("tcp %d->%d, udp %d->%d, echo id %d seq %d", tcp.SrcPort, tcp.DstPort, udp.SrcPort, udp.DstPort, icmp.Id, icmp.Seq)
		}
	})
	t.Run("IPv6 is a fixed UDP packet", func(t *testing.T) {
		if decode(t, bpftest.Frame{EtherType: layers.EthernetTypeIPv6}).Layer(layers.LayerTypeIPv6) == nil {
			t.Error("no IPv6 header")
		}
	})
}
