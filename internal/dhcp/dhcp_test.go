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

func reqOpt(ip string) []byte {
	return append([]byte{optRequested, 4}, netip.MustParseAddr(ip).AsSlice()...)
}

// requestCases are well-formed requests and the reply type each gets (0: none).
var requestCases = []struct {
	name string
	msg  []byte
	want uint8
}{
	{"discover", request(Discover), Offer},
	{"own address", request(Request, reqOpt("10.1.1.2")), Ack},
	{"another address", request(Request, reqOpt("10.1.1.9")), Nak},
	{"another server's offer", request(Request, reqOpt("10.1.1.2"), []byte{optServerID, 4, 192, 168, 0, 1}), 0},
	{"our own server id", request(Request, reqOpt("10.1.1.2"), []byte{optServerID, 4, 10, 1, 1, 1}), Ack},
	{"release", request(Release), 0},
	{"decline", request(Decline), 0},
	{"inform", request(Inform), Ack},
	{"padded options", request(Discover, []byte{optPad, optPad, optParamList, 2, optRouter, optDNS}), Offer},
}

func TestRequestIsAckedOnlyForTheVMsAddress(t *testing.T) {
	for _, c := range requestCases {
		m, err := Parse(c.msg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if _, typ := Reply(m, lease); typ != c.want {
			t.Errorf("%s: reply type %d, want %d", c.name, typ, c.want)
		}
	}
}

// malformedCases are messages Parse must refuse, and a part of the reason.
var malformedCases = func() []struct {
	name string
	b    []byte
	want string
} {
	good := request(Discover)
	return []struct {
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
		{"empty", nil, "shorter than a DHCP header"},
		{"option length byte missing", append(append([]byte{}, good[:len(good)-1]...), optRequested), "runs past the message"},
	}
}()

func TestMalformedMessagesAreRejectedWithAReason(t *testing.T) {
	for _, c := range malformedCases {
		if _, err := Parse(c.b); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.name, err, c.want)
		}
	}
}

// FuzzParseNeverPanics feeds Parse what a VM can put in a DHCP datagram
// (seeded with the tables above) and holds it to: no panic; anything
// refused is refused with a "dhcp:" error; anything accepted is a client
// request whose reply, if one is due, is a well-formed BOOTREPLY of the
// type the table's rules give it, echoing the client's transaction and
// hardware address, with options that parse and end.
func FuzzParseNeverPanics(f *testing.F) {
	for _, c := range requestCases {
		f.Add(c.msg)
	}
	for _, c := range malformedCases {
		f.Add(c.b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		in := append([]byte(nil), b...)
		m, err := Parse(b)
		if err != nil {
			if m != nil || !strings.HasPrefix(err.Error(), "dhcp: ") {
				t.Fatalf("refused with message %+v and error %q; want no message and a dhcp: error", m, err)
			}
			return
		}
		if m.Op != opRequest || m.Type == 0 || len(m.CHAddr) != 6 {
			t.Fatalf("accepted %+v: not a client request with a type and an Ethernet address", m)
		}
		chaddr := m.CHAddr.String()
		for i := range b {
			b[i] ^= 0xff // the message must not alias the datagram's buffer
		}
		if m.CHAddr.String() != chaddr {
			t.Fatalf("the parsed hardware address changed with the datagram's buffer")
		}
		copy(b, in)
		reply, typ := Reply(m, lease)
		checkReply(t, m, reply, typ)
	})
}

// checkReply holds a reply to the rules of Reply's doc and RFC 2131.
func checkReply(t *testing.T, m *Message, reply []byte, typ uint8) {
	t.Helper()
	want := map[uint8]uint8{Discover: Offer, Request: Ack, Inform: Ack}[m.Type]
	if m.Type == Request {
		asked := m.Requested
		if !asked.IsValid() {
			asked = m.CIAddr
		}
		switch {
		case m.ServerID.IsValid() && m.ServerID != lease.Gateway:
			want = 0
		case asked != lease.IP:
			want = Nak
		}
	}
	if typ != want {
		t.Fatalf("message type %d got reply type %d, want %d (%+v)", m.Type, typ, want, m)
	}
	if typ == 0 {
		if reply != nil {
			t.Fatalf("no reply type but %d bytes of reply", len(reply))
		}
		return
	}
	if len(reply) < 300 || reply[0] != opReply || reply[1] != 1 || reply[2] != 6 {
		t.Fatalf("reply of %d bytes, header % x: not a BOOTREPLY of at least 300 bytes", len(reply), reply[:min(len(reply), 4)])
	}
	if binary.BigEndian.Uint32(reply[4:]) != m.XID || net.HardwareAddr(reply[28:34]).String() != m.CHAddr.String() {
		t.Fatalf("xid %x chaddr %s not echoed", binary.BigEndian.Uint32(reply[4:]), net.HardwareAddr(reply[28:34]))
	}
	if binary.BigEndian.Uint32(reply[fixedLen:]) != magic {
		t.Fatal("reply has no magic cookie")
	}
	yiaddr := netip.AddrFrom4([4]byte(reply[16:20]))
	switch {
	case typ == Offer || (typ == Ack && m.Type == Request):
		if yiaddr != lease.IP {
			t.Fatalf("%d gives %s, not the VM's own %s", typ, yiaddr, lease.IP)
		}
	case !yiaddr.IsUnspecified():
		t.Fatalf("reply type %d to message type %d gives an address %s", typ, m.Type, yiaddr)
	}
	opts := map[byte][]byte{}
	o := reply[fixedLen+4:]
	end := false
	for i := 0; i < len(o) && !end; {
		switch {
		case o[i] == optEnd:
			end = true
		case o[i] == optPad:
			i++
		case i+1 >= len(o) || i+2+int(o[i+1]) > len(o):
			t.Fatalf("reply option %d at %d runs past the reply", o[i], i)
		default:
			opts[o[i]] = o[i+2 : i+2+int(o[i+1])]
			i += 2 + int(o[i+1])
		}
	}
	if !end {
		t.Fatal("reply options have no end")
	}
	if len(opts[optMsgType]) != 1 || opts[optMsgType][0] != typ {
		t.Fatalf("reply's message type option %v, want [%d]", opts[optMsgType], typ)
	}
	if string(opts[optServerID]) != string(lease.Gateway.AsSlice()) {
		t.Fatalf("reply's server id %v, want the VM's gateway", opts[optServerID])
	}
}
