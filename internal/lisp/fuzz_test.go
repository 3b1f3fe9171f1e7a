package lisp

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func seedControl(f *testing.F) {
	for _, h := range []string{goldenRequest, goldenReply, goldenNegative, goldenRegisterZeroAuth, goldenNotifyZeroAuth} {
		f.Add(unhex(f, h))
	}
	f.Add([]byte{})
	f.Add(unhex(f, "3a"+goldenRegisterZeroAuth[2:]+strings.Repeat("00", 24)))
	f.Add(unhex(f, "14 00 00 01"+nonceHex+"00 00 00 01 c0 00 02 01 00 20 00 01 0a 01 02 03"+goldenRecord[:0]))
}

// refused holds for every input a decoder refuses: the error is a *Error
// that names a field.
func refused(t *testing.T, b []byte, err error) {
	t.Helper()
	var de *Error
	if !errors.As(err, &de) || de.Field == "" || !strings.HasPrefix(err.Error(), "lisp: ") {
		t.Fatalf("%x refused with %v: want a *lisp.Error naming a field", b, err)
	}
	if de.Offset < 0 || de.Offset > len(b) && de.Offset != MaxMessageLen {
		t.Fatalf("%x: error offset %d outside the message", b, de.Offset)
	}
}

// roundTrip holds for every input decode accepts: the message encodes, and
// what it encodes to decodes to the same message (decoders ignore reserved
// bits, so bytes may differ there). It returns the message, or false when
// decode refused b (as refused requires).
func roundTrip[M any, P interface {
	*M
	Encode() ([]byte, error)
}](t *testing.T, b []byte, decode func([]byte) (M, error)) (M, bool) {
	t.Helper()
	m, err := decode(b)
	if err != nil {
		refused(t, b, err)
		return m, false
	}
	e, err := P(&m).Encode()
	if err != nil {
		t.Fatalf("accepted %x as %+v, which does not encode: %v", b, m, err)
	}
	again, err := decode(e)
	if err != nil || !reflect.DeepEqual(again, m) {
		t.Fatalf("%+v encodes to %x, which decodes to %+v, %v", m, e, again, err)
	}
	return m, true
}

// An accepted message re-encodes to itself.
func FuzzDecodeMapRequest(f *testing.F) {
	seedControl(f)
	f.Fuzz(func(t *testing.T, b []byte) { roundTrip(t, b, DecodeMapRequest) })
}

func FuzzDecodeMapReply(f *testing.F) {
	seedControl(f)
	f.Fuzz(func(t *testing.T, b []byte) { roundTrip(t, b, DecodeMapReply) })
}

// Map-Register and Map-Notify: besides the round trip, Authenticate never
// panics and never accepts a message under a key it was not sealed with.
func FuzzDecodeMapRegisterAndNotify(f *testing.F) {
	seedControl(f)
	key := []byte("fuzz-site-secret")
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := Authenticate(b, key); err == nil {
			t.Fatalf("%x authenticates under a key no one sealed it with", b)
		}
		t0, err := MessageType(b)
		if err != nil {
			refused(t, b, err)
			return
		}
		if t0 != TypeMapRegister {
			roundTrip(t, b, DecodeMapNotify)
			return
		}
		if m, ok := roundTrip(t, b, DecodeMapRegister); ok {
			if _, err := m.Seal(m.KeyID, key); err != nil {
				t.Fatalf("an accepted message does not seal: %v", err)
			}
		}
	})
}

func FuzzParseDataPacket(f *testing.F) {
	f.Add(unhex(f, "c8 ab cd ef 00 00 2a 03 45"+strings.Repeat("00", 19)))
	f.Add(unhex(f, "90 12 34 56 00 00 00 00 60"+strings.Repeat("00", 39)))
	f.Add([]byte{0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, inner, err := ParseDataPacket(b)
		if err != nil {
			refused(t, b, err)
			return
		}
		// What is read back is what the encoder writes.
		m, err := h.Marshal()
		if err != nil {
			t.Fatalf("%x parsed as %+v, which does not marshal: %v", b, h, err)
		}
		back, err := ParseDataHeader(m[:])
		if err != nil || back != h {
			t.Fatalf("%+v marshals to %x, which parses to %+v, %v", h, m, back, err)
		}
		if len(inner) != len(b)-DataHeaderLen || (inner[0]>>4 != 4 && inner[0]>>4 != 6) {
			t.Fatalf("inner %x of %x", inner, b)
		}
	})
}
