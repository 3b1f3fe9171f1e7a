package csum

import (
	"encoding/hex"
	"net"
	"strings"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSumAndChecksumMatchKnownVectors(t *testing.T) {
	for _, c := range []struct {
		name       string
		in         string
		sum, sum16 uint16
	}{
		// RFC 1071 §3: the sum of 00 01 f2 03 f4 f5 f6 f7 is dd f2.
		{"RFC 1071 example", "0001 f203 f4f5 f6f7", 0xddf2, 0x220d},
		// An IPv4 header carrying its checksum (b861) sums to ffff.
		{"IPv4 header with its checksum", "4500 0073 0000 4000 4011 b861 c0a8 0001 c0a8 00c7", 0xffff, 0},
		{"IPv4 header, checksum field zero", "4500 0073 0000 4000 4011 0000 c0a8 0001 c0a8 00c7", 0x479e, 0xb861},
		{"odd length pads with zero", "0102 03", 0x0402, 0xfbfd},
		{"carry folded round", "ffff 0001", 0x0001, 0xfffe},
		{"empty", "", 0, 0xffff},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := unhex(t, c.in)
			if got := Sum(0, b); got != c.sum {
				t.Errorf("Sum %#04x, want %#04x", got, c.sum)
			}
			if got := Checksum(b); got != c.sum16 {
				t.Errorf("Checksum %#04x, want %#04x", got, c.sum16)
			}
		})
	}
}

func TestSumOfPiecesIsSumOfWhole(t *testing.T) {
	b := unhex(t, "4500 0073 0000 4000 4011 0000 c0a8 0001 c0a8 00c7 01")
	for cut := 0; cut <= len(b); cut += 2 {
		if got, want := Sum(Sum(0, b[:cut]), b[cut:]), Sum(0, b); got != want {
			t.Errorf("cut at %d: %#04x, want %#04x", cut, got, want)
		}
	}
}

func TestSetIPv4WritesTheHeaderChecksumWhateverTheFieldHeld(t *testing.T) {
	for _, c := range []struct {
		name, hdr, want string
	}{
		{"field zero", "4500 0073 0000 4000 4011 0000 c0a8 0001 c0a8 00c7", "b861"},
		{"field stale", "4500 0073 0000 4000 4011 1234 c0a8 0001 c0a8 00c7", "b861"},
		// IHL 6: the option word (router alert) counts, the payload after
		// it does not (with it, 22b7).
		{"with options", "4600 0018 0000 4000 4011 0000 c0a8 0001 c0a8 00c7 9404 0000 0101", "23b8"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := unhex(t, c.hdr)
			SetIPv4(h)
			if got := hex.EncodeToString(h[10:12]); got != c.want {
				t.Errorf("checksum %s, want %s", got, c.want)
			}
			if Checksum(h[:int(h[0]&0x0f)*4]) != 0 {
				t.Error("the header does not verify")
			}
		})
	}
}

func TestTransportMatchesHandAndGopacket(t *testing.T) {
	// 10.1.1.2:40000 -> 10.1.2.2:53 UDP "hi", summed by hand: pseudo-header
	// 0a01+0102+0a01+0202+0011+000a, header 9c40+0035+000a, data 6869.
	udp := unhex(t, "9c40 0035 000a 0000 6869")
	if got := Transport([]byte{10, 1, 1, 2}, []byte{10, 1, 2, 2}, ProtoUDP, udp); got != 0xe3f5 {
		t.Errorf("by hand: %#04x, want 0xe3f5", got)
	}

	v4 := func(s string) net.IP { return net.ParseIP(s).To4() }
	cases := []struct {
		name string
		ip   gopacket.NetworkLayer
		l4   gopacket.SerializableLayer
	}{
		{"UDP over IPv4", &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: v4("10.1.1.2"), DstIP: v4("10.1.2.2")},
			&layers.UDP{SrcPort: 40000, DstPort: 53}},
		{"TCP over IPv4, odd payload", &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: v4("192.0.2.1"), DstIP: v4("198.51.100.7")},
			&layers.TCP{SrcPort: 33000, DstPort: 80, Seq: 0x01020304, SYN: true, Window: 64240, DataOffset: 5}},
		{"UDP over IPv6", &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: net.ParseIP("2001:db8::1"), DstIP: net.ParseIP("2001:db8::2")},
			&layers.UDP{SrcPort: 4342, DstPort: 4342}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var src, dst []byte
			var proto uint8
			switch ip := c.ip.(type) {
			case *layers.IPv4:
				src, dst, proto = ip.SrcIP, ip.DstIP, uint8(ip.Protocol)
			case *layers.IPv6:
				src, dst, proto = ip.SrcIP, ip.DstIP, uint8(ip.NextHeader)
			}
			switch l := c.l4.(type) {
			case *layers.UDP:
				_ = l.SetNetworkLayerForChecksum(c.ip)
			case *layers.TCP:
				_ = l.SetNetworkLayerForChecksum(c.ip)
			}
			buf := gopacket.NewSerializeBuffer()
			if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
				c.l4, gopacket.Payload("hello")); err != nil {
				t.Fatal(err)
			}
			seg := buf.Bytes()
			field := 6
			if proto == ProtoTCP {
				field = 16
			}
			want := uint16(seg[field])<<8 | uint16(seg[field+1])
			seg[field], seg[field+1] = 0, 0
			if got := Transport(src, dst, proto, seg); got != want {
				t.Errorf("Transport %#04x, gopacket %#04x", got, want)
			}
			seg[field], seg[field+1] = byte(want>>8), byte(want)
			if s := Sum(Pseudo(src, dst, proto, len(seg)), seg); s != 0xffff {
				t.Errorf("the segment does not verify: sum %#04x", s)
			}
		})
	}
}

func TestTransportSendsUDPZeroAsAllOnes(t *testing.T) {
	// Addresses 0, length 8: the pseudo-header sums to 0x19 and the header
	// to 0xffde + 8, 0xffff in all, so the computed checksum is 0.
	seg := []byte{0xff, 0xde, 0, 0, 0, 8, 0, 0}
	zero := []byte{0, 0, 0, 0}
	if got := Transport(zero, zero, ProtoUDP, seg); got != 0xffff {
		t.Errorf("UDP: %#04x, want 0xffff", got)
	}
	if got := ^Sum(Pseudo(zero, zero, ProtoUDP, len(seg)), seg); got != 0 {
		t.Fatalf("the case does not compute 0 (%#04x)", got)
	}
}
