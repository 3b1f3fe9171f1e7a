package lisp

import (
	"bytes"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/csum"
)

func TestECMGoldenBytesAroundAMapRequest(t *testing.T) {
	req := unhex(t, goldenRequest)
	e := ECM{Source: netip.MustParseAddrPort("192.0.2.1:40000"), Dest: netip.MustParseAddrPort("10.1.2.3:4342"), Message: req}
	got, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	// 4-byte LISP header, IPv4 (total 20+8+28 = 56 = 0x38, TTL 64, UDP),
	// UDP 40000 (0x9c40) -> 4342 (0x10f6), length 36 (0x24), checksum 0.
	want := unhex(t, "80 00 00 00 | 45 00 00 38 00 00 00 00 40 11 00 00 c0 00 02 01 0a 01 02 03 | 9c 40 10 f6 00 24 00 00 |"+goldenRequest)
	copy(want[14:16], got[14:16]) // the checksum, checked below
	if !bytes.Equal(got, want) {
		t.Fatalf("encode:\n got %x\nwant %x", got, want)
	}
	if csum.Checksum(got[4:24]) != 0 {
		t.Fatalf("inner IPv4 header checksum %x is wrong", got[14:16])
	}
	back, err := DecodeECM(got)
	if err != nil || !reflect.DeepEqual(back, e) {
		t.Fatalf("decode: %+v, %v; want %+v", back, err, e)
	}
	e6 := ECM{Source: netip.MustParseAddrPort("[2001:db8::1]:40000"), Dest: netip.MustParseAddrPort("[2001:db8:1::5]:4342"), Message: req, ToMS: true}
	b6, err := e6.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if b6[0] != 0x81 || len(b6) != 4+40+8+len(req) {
		t.Fatalf("ipv6 ecm %x", b6)
	}
	// UDP over IPv6: pseudo-header, UDP header and payload sum to 0xffff.
	pseudo := append(append(append([]byte{}, b6[4+8:4+40]...), 0, 0, 0, byte(8+len(req)), 0, 0, 0, 17), b6[44:]...)
	if csum.Checksum(pseudo) != 0 {
		t.Fatal("inner UDP checksum over IPv6 is wrong")
	}
	if back, err := DecodeECM(b6); err != nil || !reflect.DeepEqual(back, e6) {
		t.Fatalf("decode ipv6: %+v, %v", back, err)
	}
}

func TestECMDecoderNamesWhatIsWrong(t *testing.T) {
	good, err := (&ECM{Source: netip.MustParseAddrPort("192.0.2.1:40000"), Dest: netip.MustParseAddrPort("10.1.2.3:4342"), Message: unhex(t, goldenRequest)}).Encode()
	if err != nil {
		t.Fatal(err)
	}
	mut := func(i int, v byte) []byte { b := bytes.Clone(good); b[i] = v; return b }
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"tcp inside", mut(13, 6), "inner ipv4 protocol at byte 13: protocol 6: want 17"},
		{"ip length", mut(7, 0x39), "inner ipv4 total length at byte 6: 57, but 56 bytes follow"},
		{"udp length", mut(29, 0x25), "inner udp length at byte 28: 37, but the IP header leaves 36"},
		{"version 5", mut(4, 0x55), "inner ip version at byte 4: version 5"},
		{"ihl 4", mut(4, 0x44), "inner ipv4 ihl at byte 4: header length 16"},
		{"lisp-sec", mut(0, 0x88), "s bit at byte 0: LISP-SEC"},
		{"no message", good[:32], "inner ipv4 total length"},
		{"short", good[:10], "inner ipv4 header at byte 4: truncated"},
	} {
		_, err := DecodeECM(tc.b)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
}

func FuzzDecodeECM(f *testing.F) {
	req := unhex(f, goldenRequest)
	for _, e := range []ECM{
		{Source: netip.MustParseAddrPort("192.0.2.1:40000"), Dest: netip.MustParseAddrPort("10.1.2.3:4342"), Message: req},
		{Source: netip.MustParseAddrPort("[2001:db8::1]:1"), Dest: netip.MustParseAddrPort("[2001:db8::2]:4342"), Message: req, DDT: true},
	} {
		b, err := e.Encode()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := DecodeECM(b)
		if err != nil {
			refused(t, b, err)
			return
		}
		enc, err := e.Encode()
		if err != nil {
			t.Fatalf("accepted %x as %+v, which does not encode: %v", b, e, err)
		}
		again, err := DecodeECM(enc)
		if err != nil || !reflect.DeepEqual(again, e) {
			t.Fatalf("%+v encodes to %x, which decodes to %+v, %v", e, enc, again, err)
		}
	})
}
