package vcmp

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// unhex reads hand-written hex; spaces and '|' (word separators) are ignored.
func unhex(t testing.TB, s string) []byte {
	t.Helper()
	s = strings.NewReplacer(" ", "", "|", "", "\n", "", "\t", "").Replace(s)
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex in test: %v", err)
	}
	return b
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// The paper's §4.1 example: a client 10.10.10.10 talks to a server
// 20.20.20.20 (ssh); the client moves to 30.30.30.30.
var (
	client     = ap("10.10.10.10:40000")
	server     = ap("20.20.20.20:22")
	clientConn = Tuple{Proto: TCP, Local: client, Remote: server}
	serverConn = clientConn.Reverse()
)

// golden is every message with its bytes written by hand from docs/vcmp.md,
// one 32-bit word per group.
var golden = []struct {
	name string
	msg  Message
	hex  string
}{
	{"SUSP_PRIMARY from the client before it moves",
		&SuspPrimary{Record{Conn: clientConn, Phys: client}},
		"01 01 00 18 | 00 16 06 00 | 14 14 14 14 | 0a 0a 0a 0a | 0a 0a 0a 0a | 9c 40 9c 40"},
	{"SUSP_SECONDARY from the server",
		&SuspSecondary{Record{Conn: serverConn, Phys: server}},
		"01 02 00 18 | 9c 40 06 00 | 0a 0a 0a 0a | 14 14 14 14 | 14 14 14 14 | 00 16 00 16"},
	{"UPD from the client at 30.30.30.30:40001",
		&Update{Record{Conn: clientConn, Phys: ap("30.30.30.30:40001")}},
		"01 03 00 18 | 00 16 06 00 | 14 14 14 14 | 0a 0a 0a 0a | 1e 1e 1e 1e | 9c 40 9c 41"},
	{"UPD_R ok from the server",
		&UpdateReply{Record: Record{Conn: serverConn, Phys: server}, Status: UpdateOK},
		"01 04 00 18 | 9c 40 06 00 | 0a 0a 0a 0a | 14 14 14 14 | 14 14 14 14 | 00 16 00 16"},
	{"UPD_R conflict from the server",
		&UpdateReply{Record: Record{Conn: serverConn, Phys: server}, Status: UpdateConflict},
		"01 04 00 18 | 9c 40 06 03 | 0a 0a 0a 0a | 14 14 14 14 | 14 14 14 14 | 00 16 00 16"},
	{"LOC_QUERY with store, udp",
		&LocQuery{Record: Record{Conn: Tuple{UDP, client, server}, Phys: ap("30.30.30.30:40001")}, Store: true},
		"01 05 00 18 | 00 16 11 01 | 14 14 14 14 | 0a 0a 0a 0a | 1e 1e 1e 1e | 9c 40 9c 41"},
	{"LOC_QUERY without store",
		&LocQuery{Record: Record{Conn: clientConn, Phys: ap("30.30.30.30:40001")}},
		"01 05 00 18 | 00 16 06 00 | 14 14 14 14 | 0a 0a 0a 0a | 1e 1e 1e 1e | 9c 40 9c 41"},
	{"LOC_ANSWER found: the server is at 40.40.40.40:22",
		&LocAnswer{Record: Record{Conn: Tuple{UDP, client, server}, Phys: ap("30.30.30.30:40001")}, Status: LocFound, Peer: ap("40.40.40.40:22")},
		"01 06 00 20 | 00 16 11 00 | 14 14 14 14 | 0a 0a 0a 0a | 1e 1e 1e 1e | 9c 40 9c 41 | 28 28 28 28 | 00 16 00 00"},
	{"LOC_ANSWER stored",
		&LocAnswer{Record: Record{Conn: Tuple{UDP, client, server}, Phys: ap("30.30.30.30:40001")}, Status: LocStored},
		"01 06 00 20 | 00 16 11 01 | 14 14 14 14 | 0a 0a 0a 0a | 1e 1e 1e 1e | 9c 40 9c 41 | 00 00 00 00 | 00 00 00 00"},
	{"LOC_STORE",
		&LocStore{Record{Conn: clientConn, Phys: ap("30.30.30.30:40001")}},
		"01 07 00 18 | 00 16 06 00 | 14 14 14 14 | 0a 0a 0a 0a | 1e 1e 1e 1e | 9c 40 9c 41"},
	{"KEY with public key 00..1f",
		&Key{Record: Record{Conn: clientConn, Phys: client}, Public: [32]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31}},
		"01 08 00 38 | 00 16 06 00 | 14 14 14 14 | 0a 0a 0a 0a | 0a 0a 0a 0a | 9c 40 9c 40 |" +
			"00 01 02 03 | 04 05 06 07 | 08 09 0a 0b | 0c 0d 0e 0f | 10 11 12 13 | 14 15 16 17 | 18 19 1a 1b | 1c 1d 1e 1f"},
	{"AUTH around the UPD, seq 42, tag aa..",
		&Sealed{Seq: 42, Inner: &Update{Record{Conn: clientConn, Phys: ap("30.30.30.30:40001")}}, Tag: [32]byte(bytes.Repeat([]byte{0xaa}, 32))},
		"01 09 00 44 | 00 00 00 00 | 00 00 00 2a |" +
			"01 03 00 18 | 00 16 06 00 | 14 14 14 14 | 0a 0a 0a 0a | 1e 1e 1e 1e | 9c 40 9c 41 |" +
			strings.Repeat("aa aa aa aa |", 8)},
	{"BATCH of an UPD and a LOC_STORE",
		&Batch{Entries: []Message{
			&Update{Record{Conn: clientConn, Phys: ap("30.30.30.30:40001")}},
			&LocStore{Record{Conn: clientConn, Phys: ap("30.30.30.30:40001")}},
		}},
		"01 0a 00 38 | 00 02 00 00 |" +
			"01 03 00 18 | 00 16 06 00 | 14 14 14 14 | 0a 0a 0a 0a | 1e 1e 1e 1e | 9c 40 9c 41 |" +
			"01 07 00 18 | 00 16 06 00 | 14 14 14 14 | 0a 0a 0a 0a | 1e 1e 1e 1e | 9c 40 9c 41"},
	{"empty BATCH", &Batch{Entries: []Message{}}, "01 0a 00 08 | 00 00 00 00"},
	{"RELAY for the VM 10.1.1.2", &Relay{Source: netip.MustParseAddr("10.1.1.2")}, "01 0b 00 08 | 0a 01 01 02"},
	{"LOC_STORE releasing the client's record",
		Release(clientConn),
		"01 07 00 18 | 00 16 06 00 | 14 14 14 14 | 0a 0a 0a 0a | 00 00 00 00 | 9c 40 00 00"},
}

func TestGoldenBytesEncode(t *testing.T) {
	for _, g := range golden {
		t.Run(g.name, func(t *testing.T) {
			want := unhex(t, g.hex)
			got, err := Encode(g.msg)
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("encode:\n got %x\nwant %x", got, want)
			}
		})
	}
}

func TestGoldenBytesDecode(t *testing.T) {
	for _, g := range golden {
		t.Run(g.name, func(t *testing.T) {
			got, err := Decode(unhex(t, g.hex))
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !reflect.DeepEqual(got, g.msg) {
				t.Fatalf("decode:\n got %#v\nwant %#v", got, g.msg)
			}
		})
	}
}

func TestEveryCommandHasAGoldenMessage(t *testing.T) {
	seen := map[Command]bool{}
	for _, g := range golden {
		seen[g.msg.Command()] = true
	}
	for c := range fixedLen {
		if !seen[c] {
			t.Errorf("%s has no golden bytes", c)
		}
	}
}

func TestMessagesAre32BitAligned(t *testing.T) {
	for _, g := range golden {
		if n := len(unhex(t, g.hex)); n%4 != 0 {
			t.Errorf("%s: %d bytes, not a whole number of 32-bit words", g.name, n)
		}
	}
}

func TestRoundTripUDPAndExtremes(t *testing.T) {
	msgs := []Message{
		&Update{Record{Conn: Tuple{UDP, ap("0.0.0.0:0"), ap("255.255.255.255:65535")}, Phys: ap("1.2.3.4:1")}},
		&UpdateReply{Record: Record{Conn: Tuple{UDP, ap("10.0.0.1:1"), ap("10.0.0.2:2")}, Phys: ap("10.0.0.9:3")}, Status: UpdateRefused},
		&LocAnswer{Record: Record{Conn: clientConn, Phys: client}, Status: LocRefused},
		&LocAnswer{Record: Record{Conn: clientConn, Phys: client}, Status: LocNotFound},
		&Sealed{Seq: ^uint64(0), Inner: &UpdateReply{Record: Record{Conn: serverConn, Phys: server}}},
	}
	for _, m := range msgs {
		b, err := Encode(m)
		if err != nil {
			t.Fatalf("encode %#v: %v", m, err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("decode %x: %v", b, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip:\n got %#v\nwant %#v", got, m)
		}
	}
}

func TestDecodeSharesNoMemoryWithInput(t *testing.T) {
	b := unhex(t, golden[10].hex) // KEY
	m, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = 0xff
	}
	if !reflect.DeepEqual(m, golden[10].msg) {
		t.Fatalf("the decoded message changed with its input buffer: %#v", m)
	}
}

// upd is the golden VNAT_UPD, to corrupt one field at a time.
const upd = "01 03 00 18 | 00 16 06 00 | 14 14 14 14 | 0a 0a 0a 0a | 1e 1e 1e 1e | 9c 40 9c 41"

func TestDecodeRejects(t *testing.T) {
	cases := []struct {
		name  string
		hex   string
		want  error
		field string
	}{
		{"empty", "", ErrShort, "header"},
		{"three bytes", "01 03 00", ErrShort, "header"},
		{"version 0", "00" + upd[2:], ErrVersion, "Version"},
		{"version 2", "02" + upd[2:], ErrVersion, "Version"},
		{"command 0", "01 00" + upd[5:], ErrCommand, "Command"},
		{"command 12", "01 0c" + upd[5:], ErrCommand, "Command"},
		{"RELAY of 12 bytes", "01 0b 00 0c | 0a 01 01 02 | 00 00 00 00", ErrLength, "Length"},
		{"RELAY inside a batch", "01 0a 00 10 | 00 01 00 00 | 01 0b 00 08 | 0a 01 01 02", ErrField, "Command"},
		{"command 255", "01 ff" + upd[5:], ErrCommand, "Command"},
		{"length field says 20", "01 03 00 14" + upd[11:], ErrLength, "Length"},
		{"length field says 28 (a longer v1 UPD)", "01 03 00 1c" + upd[11:] + "00 00 00 00", ErrLength, "Length"},
		{"length field below the header", "01 0a 00 02 | 00 00 00 00", ErrLength, "Length"},
		{"truncated UPD", upd[:len(upd)-6], ErrShort, "Length"},
		{"trailing bytes after UPD", upd + "00 00 00 00", ErrTrailing, "Length"},
		{"one trailing byte", upd + "00", ErrTrailing, "Length"},
		{"proto icmp", "01 03 00 18 | 00 16 01 00" + upd[25:], ErrField, "Proto"},
		{"proto 0", "01 03 00 18 | 00 16 00 00" + upd[25:], ErrField, "Proto"},
		{"UPD code not zero", "01 03 00 18 | 00 16 06 01" + upd[25:], ErrField, "Code"},
		{"SUSP_PRIMARY code not zero", "01 01 00 18 | 00 16 06 80" + upd[25:], ErrField, "Code"},
		{"UPD_R status 4", "01 04 00 18 | 00 16 06 04" + upd[25:], ErrField, "Code (status)"},
		{"LOC_QUERY unknown flag", "01 05 00 18 | 00 16 06 02" + upd[25:], ErrField, "Code (flags)"},
		{"LOC_ANSWER status 4", "01 06 00 20 | 00 16 06 04" + upd[25:] + "| 00 00 00 00 | 00 00 00 00", ErrField, "Code (status)"},
		{"LOC_ANSWER stored with a location", "01 06 00 20 | 00 16 06 01" + upd[25:] + "| 28 28 28 28 | 00 16 00 00", ErrField, "R_Phys_Addr/R_Phys_Port"},
		{"LOC_ANSWER reserved not zero", "01 06 00 20 | 00 16 06 00" + upd[25:] + "| 28 28 28 28 | 00 16 00 01", ErrField, "Reserved"},
		{"LOC_ANSWER without its last word", "01 06 00 1c | 00 16 06 00" + upd[25:] + "| 28 28 28 28", ErrLength, "Length"},
		{"KEY without its key", "01 08 00 18" + upd[11:], ErrLength, "Length"},
		{"AUTH too short for anything", "01 09 00 2c | 00 00 00 00 | 00 00 00 01" + strings.Repeat("| aa aa aa aa", 8), ErrLength, "Length"},
		{"AUTH around a LOC_STORE", "01 09 00 44 | 00 00 00 00 | 00 00 00 01 | 01 07" + upd[5:] + strings.Repeat("| aa aa aa aa", 8), ErrField, "Inner.Command"},
		{"AUTH whose inner length disagrees", "01 09 00 44 | 00 00 00 00 | 00 00 00 01 | 01 03 00 14" + upd[11:] + strings.Repeat("| aa aa aa aa", 8), ErrLength, "Inner.Length"},
		{"AUTH whose inner version is 2", "01 09 00 44 | 00 00 00 00 | 00 00 00 01 | 02" + upd[2:] + strings.Repeat("| aa aa aa aa", 8), ErrVersion, "Version"},
		{"AUTH with a bad inner proto", "01 09 00 44 | 00 00 00 00 | 00 00 00 01 | 01 03 00 18 | 00 16 07 00" + upd[25:] + strings.Repeat("| aa aa aa aa", 8), ErrField, "Proto"},
		{"BATCH count larger than its entries", "01 0a 00 20 | 00 02 00 00 |" + upd, ErrShort, "Entries[1]"},
		{"BATCH count smaller than its entries", "01 0a 00 38 | 00 01 00 00 |" + upd + "|" + upd, ErrTrailing, "Entries"},
		{"BATCH reserved not zero", "01 0a 00 20 | 00 01 00 01 |" + upd, ErrField, "Reserved"},
		{"BATCH entry length past the end", "01 0a 00 20 | 00 01 00 00 | 01 03 00 1c" + upd[11:], ErrLength, "Entries[0].Length"},
		{"BATCH in a BATCH", "01 0a 00 10 | 00 01 00 00 | 01 0a 00 08 | 00 00 00 00", ErrField, "Command"},
		{"BATCH with a bad entry", "01 0a 00 20 | 00 01 00 00 | 01 03 00 18 | 00 16 06 09" + upd[25:], ErrField, "Code"},
		{"BATCH length not a multiple of 4", "01 0a 00 09 | 00 00 00 00 | 00", ErrLength, "Length"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := unhex(t, c.hex)
			m, err := Decode(b)
			if err == nil {
				t.Fatalf("decoded %x as %#v, want %v", b, m, c.want)
			}
			if m != nil {
				t.Errorf("returned a message with the error: %#v", m)
			}
			if !errors.Is(err, c.want) {
				t.Errorf("error %q, want %v", err, c.want)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != c.field {
				t.Errorf("error %q names field %q, want %q", err, fieldOf(fe), c.field)
			}
			if !strings.HasPrefix(err.Error(), "vcmp: ") {
				t.Errorf("error %q does not start with vcmp:", err)
			}
		})
	}
}

func fieldOf(fe *FieldError) string {
	if fe == nil {
		return "<no FieldError>"
	}
	return fe.Field
}

func TestEncodeRejects(t *testing.T) {
	v6 := Tuple{TCP, ap("[2001:db8::1]:1"), server}
	cases := []struct {
		name  string
		msg   Message
		field string
	}{
		{"IPv6 local virtual address", &Update{Record{Conn: v6, Phys: client}}, "L_Vir_Addr"},
		{"IPv6 physical address", &Update{Record{Conn: clientConn, Phys: ap("[::1]:1")}}, "L_Phys_Addr"},
		{"no remote address", &Update{Record{Conn: Tuple{Proto: TCP, Local: client}, Phys: client}}, "R_Vir_Addr"},
		{"proto icmp", &Update{Record{Conn: Tuple{1, client, server}, Phys: client}}, "Proto"},
		{"UPD_R status 9", &UpdateReply{Record: Record{Conn: clientConn, Phys: client}, Status: 9}, "Code (status)"},
		{"LOC_ANSWER stored with a peer", &LocAnswer{Record: Record{Conn: clientConn, Phys: client}, Status: LocStored, Peer: server}, "R_Phys_Addr"},
		{"sealed LOC_STORE", &Sealed{Seq: 1, Inner: &LocStore{Record{Conn: clientConn, Phys: client}}}, "Inner"},
		{"sealed nothing", &Sealed{Seq: 1}, "Inner"},
		{"batch in a batch", &Batch{Entries: []Message{&Batch{}}}, "Entries[0]"},
		{"nil batch entry", &Batch{Entries: []Message{nil}}, "Entries[0]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := Encode(c.msg)
			if err == nil {
				t.Fatalf("encoded %x, want an error naming %s", b, c.field)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != c.field {
				t.Fatalf("error %q names field %q, want %q", err, fieldOf(fe), c.field)
			}
		})
	}
	big := &Batch{}
	for range MaxLen/recordLen + 1 {
		big.Entries = append(big.Entries, &Update{Record{Conn: clientConn, Phys: client}})
	}
	if _, err := Encode(big); !errors.Is(err, ErrLength) {
		t.Fatalf("a %d-byte batch: error %v, want ErrLength", big.size(), err)
	}
}
