package dhcp

import (
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

var vmMAC = net.HardwareAddr{0x02, 0x00, 10, 1, 1, 2}

func request(typ byte, opts ...[]byte) []byte {
	b := make([]byte, fixedLen+4)
	b[0], b[1], b[2] = opRequest, 1, 6
	binary.BigEndian.PutUint32(b[4:], 0xdeadbeef)
	copy(b[28:], vmMAC)
	binary.BigEndian.PutUint32(b[fixedLen:], magic)
	b = append(b, optMsgType, 1, typ)
	for _, o := range opts {
		b = append(b, o...)
	}
	return append(b, optEnd)
}

var lease = Lease{
	IP: netip.MustParseAddr("10.1.1.2"), Mask: netip.MustParseAddr("255.255.255.0"),
	Gateway: netip.MustParseAddr("10.1.1.1"), DNS: []netip.Addr{netip.MustParseAddr("10.1.1.1")}, Time: 24 * time.Hour,
}

func options(t *testing.T, b []byte) map[byte][]byte {
	t.Helper()
	out := map[byte][]byte{}
	o := b[fixedLen+4:]
	for i := 0; i < len(o) && o[i] != optEnd; {
		if o[i] == optPad {
			i++
			continue
		}
		out[o[i]] = o[i+2 : i+2+int(o[i+1])]
		i += 2 + int(o[i+1])
	}
	return out
}

func TestDiscoverGetsAnOfferOfTheVMsOwnAddress(t *testing.T) {
	m, err := Parse(request(Discover))
	if err != nil {
		t.Fatal(err)
	}
	b, typ := Reply(m, lease)
	if typ != Offer {
		t.Fatalf("type %d", typ)
	}
	if got := netip.AddrFrom4([4]byte(b[16:20])); got != lease.IP {
		t.Fatalf("yiaddr %s", got)
	}
	if binary.BigEndian.Uint32(b[4:]) != 0xdeadbeef || net.HardwareAddr(b[28:34]).String() != vmMAC.String() {
		t.Fatal("xid or chaddr not echoed")
	}
	o := options(t, b)
	if string(o[optRouter]) != string(lease.Gateway.AsSlice()) || string(o[optSubnetMask]) != string([]byte{255, 255, 255, 0}) {
		t.Fatalf("router %v mask %v", o[optRouter], o[optSubnetMask])
	}
	if binary.BigEndian.Uint32(o[optLease]) != 86400 || len(o[optDNS]) != 4 || o[optServerID] == nil {
		t.Fatalf("lease %v dns %v server id %v", o[optLease], o[optDNS], o[optServerID])
	}
	if len(b) < 300 {
		t.Fatalf("reply %d bytes, under the BOOTP minimum", len(b))
	}
}

func TestRequestIsAckedOnlyForTheVMsAddress(t *testing.T) {
	reqOpt := func(ip string) []byte { return append([]byte{optRequested, 4}, netip.MustParseAddr(ip).AsSlice()...) }
	cases := []struct {
		name string
		msg  []byte
		want uint8
	}{
		{"own address", request(Request, reqOpt("10.1.1.2")), Ack},
		{"another address", request(Request, reqOpt("10.1.1.9")), Nak},
		{"another server's offer", request(Request, reqOpt("10.1.1.2"), []byte{optServerID, 4, 192, 168, 0, 1}), 0},
		{"release", request(Release), 0},
		{"inform", request(Inform), Ack},
	}
	for _, c := range cases {
		m, err := Parse(c.msg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if _, typ := Reply(m, lease); typ != c.want {
			t.Errorf("%s: reply type %d, want %d", c.name, typ, c.want)
		}
	}
}

func TestMalformedMessagesAreRejectedWithAReason(t *testing.T) {
	good := request(Discover)
	cases := []struct {
		name string
		b    []byte
		want string
	}{
		{"short", good[:100], "shorter than a DHCP header"},
		{"no cookie", append(append([]byte{}, good[:fixedLen]...), 0, 0, 0, 0, optEnd), "no magic cookie"},
		{"option past end", append(append([]byte{}, good[:len(good)-1]...), optRequested, 40, 1), "runs past the message"},
		{"reply op", func() []byte { b := append([]byte{}, good...); b[0] = opReply; return b }(), "not a client request"},
		{"no type", func() []byte { b := append([]byte{}, good[:fixedLen+4]...); return append(b, optEnd) }(), "no message type"},
		{"not ethernet", func() []byte { b := append([]byte{}, good...); b[1] = 6; return b }(), "want Ethernet"},
	}
	for _, c := range cases {
		if _, err := Parse(c.b); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.name, err, c.want)
		}
	}
}

func FuzzParseNeverPanics(f *testing.F) {
	f.Add(request(Discover))
	f.Add(request(Request, []byte{optRequested, 4, 10, 1, 1, 2}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := Parse(b); err == nil {
			Reply(m, lease)
		}
	})
}
