package tapwire

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket/pcapgo"

	"github.com/onehop/onehop/internal/csum"
	"github.com/onehop/onehop/internal/tappolicy"
)

var (
	hostMAC = net.HardwareAddr{0xaa, 0, 0, 0, 0, 1}
	colMAC  = net.HardwareAddr{0xaa, 0, 0, 0, 0, 0xc0}
	host    = netip.MustParseAddr("192.168.50.11")
	col     = netip.MustParseAddr("192.168.50.200")
)

// What the datapath sends is the header, the length filled in, then the
// frame; Decap (what the controller's capture reads after the IPv4
// header) gives back the frame and the session.
func TestDecapReadsWhatEncapHeaderWrites(t *testing.T) {
	inner := append(bytes.Repeat([]byte{0xee}, 12), 0x08, 0x00, 0x45, 1, 2, 3)
	for _, c := range []struct {
		encap   string
		n       int
		proto   uint16
		session uint16
	}{{tappolicy.EncapERSPAN2, ERSPAN2Len, ProtoERSPAN2, 7}, {tappolicy.EncapERSPAN3, ERSPAN3Len, ProtoERSPAN3, 7}, {tappolicy.EncapGRE, GRELen, ProtoTEB, 0}} {
		h, n, err := EncapHeader(c.encap, 7, hostMAC, colMAC, host, col)
		if err != nil || n != c.n {
			t.Fatalf("%s: %d bytes, %v", c.encap, n, err)
		}
		if sum := csum.Checksum(h[14:34]); sum != 0 {
			t.Errorf("%s: the template's IPv4 checksum (length 0) does not verify: %#x", c.encap, sum)
		}
		if got := uint16(h[36])<<8 | uint16(h[37]); got != c.proto {
			t.Errorf("%s: GRE protocol %#x, want %#x", c.encap, got, c.proto)
		}
		if h[n+12] != 0x08 || h[n+13] != 0 {
			t.Errorf("%s: no inner EtherType after the header: % x", c.encap, h[n:n+14])
		}
		wire := append(append([]byte{}, h[34:n]...), inner...)
		frame, session, ok := Decap(wire)
		if !ok || !bytes.Equal(frame, inner) || session != c.session {
			t.Errorf("%s: Decap gives %x session %d ok %v; want %x session %d", c.encap, frame, session, ok, inner, c.session)
		}
	}
	for name, b := range map[string][]byte{
		"short":           {0x10, 0},
		"gre version 1":   {0x00, 0x01, 0x65, 0x58},
		"another proto":   append([]byte{0, 0, 0x08, 0x00}, inner...),
		"erspan2 as v2":   append([]byte{0x10, 0, 0x88, 0xbe, 0, 0, 0, 0, 0x20, 0, 0, 7, 0, 0, 0, 0}, inner...),
		"truncated frame": {0x10, 0, 0x88, 0xbe, 0, 0, 0, 0, 0x10, 0, 0, 7, 0, 0, 0, 0, 1, 2},
	} {
		if _, _, ok := Decap(b); ok {
			t.Errorf("%s: Decap took %x", name, b)
		}
	}
}

func TestThePcapStreamReadsBack(t *testing.T) {
	var buf bytes.Buffer
	w := NewPcapWriter(&buf)
	if err := w.Header(); err != nil {
		t.Fatal(err)
	}
	frames := [][]byte{bytes.Repeat([]byte{1}, 60), bytes.Repeat([]byte{2}, 1514)}
	for _, f := range frames {
		if err := w.Packet(time.Unix(1, 0), f); err != nil {
			t.Fatal(err)
		}
	}
	r, err := pcapgo.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range frames {
		got, _, err := r.ReadPacketData()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("frame %d: %v", i, err)
		}
	}
}
