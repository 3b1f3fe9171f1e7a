package lisp

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	s = strings.NewReplacer(" ", "", "|", "", "\n", "", "\t", "").Replace(s)
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex in test: %v", err)
	}
	return b
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }

const nonceHex = "01 02 03 04 05 06 07 08"
const nonce = 0x0102030405060708

// The golden bytes are written from RFC 9301's figures by hand, field by
// field, not produced by the encoder.
var (
	goldenRequest = "10 00 00 01 |" + nonceHex + "| 00 00 | 00 01 c0 00 02 01 | 00 20 00 01 0a 01 02 03"

	// 10.1.0.0/16, TTL 1440 min, authoritative, two RLOCs p1 w50 (R set),
	// the second also L.
	goldenRecord = `00 00 05 a0 | 02 10 10 00 | 00 00 00 01 | 0a 01 00 00 |
		01 32 ff 00 00 01 00 01 c0 00 02 0a |
		01 32 ff 00 00 05 00 01 c6 33 64 0a`
	goldenReply = "20 00 00 01 |" + nonceHex + "|" + goldenRecord

	// Negative: 11.0.0.0/8, 15 min, natively-forward (1<<13) and A (1<<12).
	goldenNegative = "20 00 00 01 |" + nonceHex + "| 00 00 00 0f | 00 08 30 00 | 00 00 00 01 | 0b 00 00 00"

	// P and M set: 0x38000101; key id 1, algorithm 2, 16 bytes of
	// authentication data (zero here, filled by the test).
	goldenRegisterZeroAuth = "38 00 01 01 |" + nonceHex + "| 01 02 00 10 |" + strings.Repeat("00", 16) + "|" + goldenRecord
	goldenNotifyZeroAuth   = "40 00 00 01 |" + nonceHex + "| 01 02 00 10 |" + strings.Repeat("00", 16) + "|" + goldenRecord
)

func goldenRec() Record {
	return Record{EID: pfx("10.1.0.0/16"), TTL: 1440 * time.Minute, Authoritative: true, Locators: []Locator{
		{Addr: addr("192.0.2.10"), Priority: 1, Weight: 50, MPriority: 255, Reachable: true},
		{Addr: addr("198.51.100.10"), Priority: 1, Weight: 50, MPriority: 255, Reachable: true, Local: true},
	}}
}

func TestMapRequestGoldenBytes(t *testing.T) {
	m := MapRequest{Nonce: nonce, ITRRLOCs: []netip.Addr{addr("192.0.2.1")}, EIDs: []netip.Prefix{pfx("10.1.2.3/32")}}
	got, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	want := unhex(t, goldenRequest)
	if !bytes.Equal(got, want) {
		t.Fatalf("encode:\n got %x\nwant %x", got, want)
	}
	back, err := DecodeMapRequest(want)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, m) {
		t.Fatalf("decode: got %+v, want %+v", back, m)
	}
}

func TestMapReplyGoldenBytes(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    MapReply
		hex  string
	}{
		{"positive", MapReply{Nonce: nonce, Records: []Record{goldenRec()}}, goldenReply},
		{"negative native-forward", MapReply{Nonce: nonce, Records: []Record{{EID: pfx("11.0.0.0/8"), TTL: 15 * time.Minute,
			Action: ActionNativelyForward, Authoritative: true}}}, goldenNegative},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.m.Encode()
			if err != nil {
				t.Fatal(err)
			}
			want := unhex(t, tc.hex)
			if !bytes.Equal(got, want) {
				t.Fatalf("encode:\n got %x\nwant %x", got, want)
			}
			back, err := DecodeMapReply(want)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back, tc.m) {
				t.Fatalf("decode: got %+v, want %+v", back, tc.m)
			}
		})
	}
}

// referenceMAC is RFC 9301 §5.6's rule computed independently: HMAC-SHA-256
// over the whole message with the 16 authentication bytes (at offset 16)
// zeroed, truncated to its first 16 bytes (RFC 4868).
func referenceMAC(msg, key []byte) []byte {
	z := bytes.Clone(msg)
	copy(z[16:32], make([]byte, 16))
	h := hmac.New(sha256.New, key)
	h.Write(z)
	return h.Sum(nil)[:16]
}

func TestMapRegisterAndNotifyGoldenBytesWithHMACSHA256128(t *testing.T) {
	key := []byte("site-one-shared-secret")
	reg := MapRegister{Nonce: nonce, ProxyReply: true, WantMapNotify: true, Records: []Record{goldenRec()}}
	got, err := reg.Seal(1, key)
	if err != nil {
		t.Fatal(err)
	}
	want := unhex(t, goldenRegisterZeroAuth)
	copy(want[16:32], referenceMAC(want, key))
	if !bytes.Equal(got, want) {
		t.Fatalf("seal:\n got %x\nwant %x", got, want)
	}
	if !bytes.Equal(reg.AuthData, want[16:32]) || reg.KeyID != 1 || reg.AlgorithmID != AlgHMACSHA256_128 {
		t.Fatalf("seal left key id %d, algorithm %d, auth %x", reg.KeyID, reg.AlgorithmID, reg.AuthData)
	}
	back, err := DecodeMapRegister(want)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, reg) {
		t.Fatalf("decode: got %+v, want %+v", back, reg)
	}
	if err := Authenticate(want, key); err != nil {
		t.Fatalf("the sealed message does not authenticate: %v", err)
	}

	nt := MapNotify{Nonce: nonce, Records: []Record{goldenRec()}}
	got, err = nt.Seal(1, key)
	if err != nil {
		t.Fatal(err)
	}
	want = unhex(t, goldenNotifyZeroAuth)
	copy(want[16:32], referenceMAC(want, key))
	if !bytes.Equal(got, want) {
		t.Fatalf("notify seal:\n got %x\nwant %x", got, want)
	}
	if err := Authenticate(want, key); err != nil {
		t.Fatalf("the sealed notify does not authenticate: %v", err)
	}
	nback, err := DecodeMapNotify(want)
	if err != nil || !reflect.DeepEqual(nback, nt) {
		t.Fatalf("notify decode: %+v, %v; want %+v", nback, err, nt)
	}
}

// Every byte the MAC covers matters: flipping any one of them (the auth
// data included) makes the message fail to authenticate, and so does
// another key. Unauthenticated and unknown-algorithm messages are told
// apart.
func TestMapRegisterAuthenticationRefusesAlteredWrongKeyAndMissingAuth(t *testing.T) {
	key := []byte("site-one-shared-secret")
	reg := MapRegister{Nonce: nonce, WantMapNotify: true, Records: []Record{goldenRec()}}
	b, err := reg.Seal(7, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := Authenticate(b, []byte("another-secret-key")); !errors.Is(err, ErrBadAuth) {
		t.Fatalf("wrong key: %v, want ErrBadAuth", err)
	}
	for i := range b {
		if i == 12 || i == 13 || i == 14 || i == 15 {
			continue // key id, algorithm, length: changing them is another error (below)
		}
		c := bytes.Clone(b)
		c[i] ^= 0x01
		err := Authenticate(c, key)
		var de *Error
		if err == nil || (!errors.Is(err, ErrBadAuth) && !errors.As(err, &de)) {
			t.Fatalf("byte %d flipped: %v, want ErrBadAuth or a decoding error", i, err)
		}
	}
	plain := MapRegister{Nonce: nonce, Records: []Record{goldenRec()}}
	pb, err := plain.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if err := Authenticate(pb, key); !errors.Is(err, ErrNoAuth) {
		t.Fatalf("no auth data: %v, want ErrNoAuth", err)
	}
	sha1 := MapRegister{Nonce: nonce, Records: []Record{goldenRec()}, AlgorithmID: AlgHMACSHA1_96, AuthData: make([]byte, 20)}
	sb, _ := sha1.Encode()
	if err := Authenticate(sb, key); !errors.Is(err, ErrUnsupportedAlgorithm) {
		t.Fatalf("sha1: %v, want ErrUnsupportedAlgorithm", err)
	}
}

func TestDataHeaderGoldenBytes(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    DataHeader
		hex  string
	}{
		{"nonce, instance id and 8 LSBs", DataHeader{NonceValid: true, LSBValid: true, InstanceIDValid: true, Nonce: 0xabcdef, InstanceID: 42, LSB: 3}, "c8 ab cd ef 00 00 2a 03"},
		{"echo-nonce request", DataHeader{NonceValid: true, EchoNonce: true, Nonce: 1}, "a0 00 00 01 00 00 00 00"},
		{"map versions", DataHeader{MapVersioned: true, SourceMapVersion: 0x123, DestMapVersion: 0x456}, "10 12 34 56 00 00 00 00"},
		{"32 LSBs", DataHeader{LSBValid: true, LSB: 0x80000001}, "40 00 00 00 80 00 00 01"},
		{"instance id only, key bits", DataHeader{InstanceIDValid: true, InstanceID: 0xffffff, KeyBits: 2}, "0a 00 00 00 ff ff ff 00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.h.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			want := unhex(t, tc.hex)
			if !bytes.Equal(got[:], want) {
				t.Fatalf("marshal: got %x, want %x", got, want)
			}
			back, err := ParseDataHeader(want)
			if err != nil || back != tc.h {
				t.Fatalf("parse: %+v, %v; want %+v", back, err, tc.h)
			}
		})
	}
}

// RFC 9300 §5.3: N and V together are read as a nonce; E without N, the R
// bit and the nonce bytes without N or V are ignored. The encoder refuses
// to write such headers.
func TestDataHeaderReadsForbiddenCombinationsAsTheRFCSays(t *testing.T) {
	h, err := ParseDataHeader(unhex(t, "90 12 34 56 00 00 00 00"))
	if err != nil || !h.NonceValid || h.MapVersioned || h.Nonce != 0x123456 {
		t.Fatalf("N+V: %+v, %v; want a nonce 0x123456 and no map versions", h, err)
	}
	h, err = ParseDataHeader(unhex(t, "24 ff ff ff 00 00 00 07"))
	if err != nil || h != (DataHeader{}) {
		t.Fatalf("E and R without N, LSBs without L: %+v, %v; want all ignored", h, err)
	}
	for _, bad := range []DataHeader{
		{NonceValid: true, MapVersioned: true},
		{EchoNonce: true},
		{NonceValid: true, Nonce: 1 << 24},
		{InstanceIDValid: true, LSBValid: true, LSB: 0x100},
		{InstanceID: 5},
		{MapVersioned: true, DestMapVersion: 0x1000},
	} {
		if _, err := bad.Marshal(); err == nil {
			t.Errorf("%+v marshalled; want an error", bad)
		}
	}
}

func TestDataPacketRefusesShortAndNonIPInnerPackets(t *testing.T) {
	hdr := "c8 ab cd ef 00 00 2a 03"
	for _, tc := range []struct{ name, hex, want string }{
		{"7 bytes", "c8 ab cd ef 00 00 2a", "data header: header at byte 7: truncated: 7 bytes, want 8"},
		{"no inner packet", hdr, "inner header at byte 8: no inner packet"},
		{"inner version 5", hdr + "50" + strings.Repeat("00", 19), "inner ip version at byte 8: version 5: want 4 or 6"},
		{"inner IPv4 of 19 bytes", hdr + "45" + strings.Repeat("00", 18), "truncated: 19 bytes of inner IPv4 header, want 20"},
		{"inner IPv6 of 39 bytes", hdr + "60" + strings.Repeat("00", 38), "want 40"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ParseDataPacket(unhex(t, tc.hex))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	h, inner, err := ParseDataPacket(unhex(t, hdr+"45"+strings.Repeat("00", 19)))
	if err != nil || len(inner) != 20 || h.InstanceID != 42 {
		t.Fatalf("a good packet: %+v, %d inner bytes, %v", h, len(inner), err)
	}
}

// Decoders refuse bad input with an *Error that names the message, the
// field and the byte offset.
func TestDecodersNameWhatIsWrongAndWhere(t *testing.T) {
	long := unhex(t, goldenReply)
	for _, tc := range []struct {
		name   string
		decode func([]byte) error
		hex    string
		want   string
	}{
		{"empty", reqDec, "", "map-request: header at byte 0: truncated: need 4 bytes, 0 left"},
		{"wrong type", reqDec, goldenReply, "map-request: type at byte 0: type 2 (map-reply), want 1 (map-request)"},
		{"short nonce", reqDec, "10 00 00 01 01 02 03", "map-request: nonce at byte 4: truncated: need 8 bytes, 3 left"},
		{"zero records", reqDec, "10 00 00 00" + nonceHex, "record count at byte 3: 0 records"},
		{"ITR-RLOC LCAF", reqDec, "10 00 00 01" + nonceHex + "00 00 40 03 00 00", "itr-rloc 0 afi at byte 14: afi 16387 (LCAF) is not supported"},
		{"ITR-RLOC afi 0", reqDec, "10 00 00 01" + nonceHex + "00 00 00 00", "itr-rloc 0 afi at byte 14: afi 0 (no address) where an address is required"},
		{"EID mask 33", reqDec, "10 00 00 01" + nonceHex + "00 00 00 01 c0 00 02 01 00 21 00 01 0a 01 02 03", "eid record 0 mask-len at byte 21: mask length 33 is longer than the 32 bits"},
		{"EID host bits", reqDec, "10 00 00 01" + nonceHex + "00 00 00 01 c0 00 02 01 00 18 00 01 0a 01 02 03", "eid record 0 at byte 21: 10.1.2.3/24 has bits set past its mask length"},
		{"trailing bytes", reqDec, goldenRequest + "00", "end at byte 28: 1 bytes after the last record"},
		{"oversized", repDec, hex.EncodeToString(append(long, make([]byte, MaxMessageLen)...)), "map-reply: length at byte 8192: "},
		{"record cut in a locator", repDec, hex.EncodeToString(long[:len(long)-3]), "map-reply: record 0 locator 1 at byte 48: truncated: need 4 bytes, 1 left"},
		{"locator afi 3", repDec, strings.Replace(goldenReply, "00 05 00 01 c6", "00 05 00 03 c6", 1), "record 0 locator 1 afi at byte 46: afi 3 is not supported"},
		{"action 6", repDec, strings.Replace(goldenNegative, "30 00", "d0 00", 1), "record 0 act at byte 18: action 6 is unassigned"},
		{"LISP-SEC", repDec, "22" + goldenReply[2:], "s bit at byte 0: LISP-SEC (S bit) is not supported"},
		{"more records than sent", repDec, "20 00 00 02" + goldenReply[11:], "record 1 ttl at byte 52: truncated"},
		{"auth length past the end", regDec, "38 00 01 01" + nonceHex + "01 02 01 00" + strings.Repeat("00", 16), "authentication data length at byte 14: 256 bytes announced, 16 left"},
		{"auth data with algorithm 0", regDec, "38 00 01 01" + nonceHex + "01 00 00 10" + strings.Repeat("00", 16), "authentication data length at byte 14: 16 bytes of authentication data with algorithm 0"},
		{"xtr-id missing", regDec, "3a" + goldenRegisterZeroAuth[2:], "xtr-id at byte 72: truncated: need 24 bytes, 0 left"},
		{"notify of register", ntfDec, goldenRegisterZeroAuth, "map-notify: type at byte 0: type 3 (map-register), want 4 (map-notify)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.decode(unhex(t, tc.hex))
			var de *Error
			if !errors.As(err, &de) {
				t.Fatalf("got %v, want a *lisp.Error", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func reqDec(b []byte) error { _, err := DecodeMapRequest(b); return err }
func repDec(b []byte) error { _, err := DecodeMapReply(b); return err }
func regDec(b []byte) error { _, err := DecodeMapRegister(b); return err }
func ntfDec(b []byte) error { _, err := DecodeMapNotify(b); return err }

func TestEncodersRefuseWhatTheWireCannotCarry(t *testing.T) {
	rec := goldenRec()
	for _, tc := range []struct {
		name string
		mut  func(*Record)
		want string
	}{
		{"ttl not whole minutes", func(r *Record) { r.TTL = 90 * time.Second }, "whole minutes"},
		{"negative ttl", func(r *Record) { r.TTL = -time.Minute }, "negative"},
		{"host bits", func(r *Record) { r.EID = pfx("10.1.2.3/16") }, "host bits set"},
		{"action 7", func(r *Record) { r.Action = 7 }, "unassigned"},
		{"map version", func(r *Record) { r.MapVersion = 4096 }, "12-bit"},
		{"locator missing", func(r *Record) { r.Locators[0].Addr = netip.Addr{} }, "locator 0"},
		{"mapped locator", func(r *Record) { r.Locators[1].Addr = addr("::ffff:192.0.2.1") }, "locator 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rec.Clone()
			tc.mut(&r)
			m := MapReply{Nonce: 1, Records: []Record{r}}
			if _, err := m.Encode(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestIPv6EIDsAndLocatorsRoundTrip(t *testing.T) {
	m := MapReply{Nonce: 9, Records: []Record{{EID: pfx("2001:db8:1::/48"), TTL: time.Minute, Locators: []Locator{
		{Addr: addr("2001:db8::1"), Priority: 2, Weight: 100}, {Addr: addr("192.0.2.7"), Priority: 255}}}}}
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeMapReply(b)
	if err != nil || !reflect.DeepEqual(back, m) {
		t.Fatalf("got %+v, %v; want %+v", back, err, m)
	}
	if u := back.Records[0].Usable(); len(u) != 1 || u[0].Addr != addr("2001:db8::1") {
		t.Fatalf("usable %+v: want only the priority-2 locator", u)
	}
}
