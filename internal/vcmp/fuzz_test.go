package vcmp

import (
	"bytes"
	"strings"
	"testing"
)

func seedGolden(f *testing.F) {
	for _, g := range golden {
		f.Add(unhex(f, g.hex))
	}
	f.Add([]byte{})
	f.Add([]byte{1, 9, 0, 0x44})
	f.Add(unhex(f, "01 0a 00 10 | 00 01 00 00 | 01 0a 00 08 | 00 00 00 00"))
}

// checkDecoded holds for every input a decoder accepts: the error says vcmp
// and comes without a message, and an accepted message re-encodes to exactly
// the input (decoding is canonical, which Open relies on to MAC the bytes
// that arrived) and shares no memory with it.
func checkDecoded(t *testing.T, b []byte, m Message, err error) {
	t.Helper()
	if err != nil {
		if m != nil || !strings.HasPrefix(err.Error(), "vcmp: ") {
			t.Fatalf("refused with message %#v and error %q; want no message and a vcmp: error", m, err)
		}
		return
	}
	got, eerr := Encode(m)
	if eerr != nil {
		t.Fatalf("accepted %x as %#v, which does not encode: %v", b, m, eerr)
	}
	if !bytes.Equal(got, b) {
		t.Fatalf("not canonical: %x decodes to %#v, which encodes to %x", b, m, got)
	}
	for i := range b {
		b[i] ^= 0xff
	}
	again, _ := Encode(m)
	if !bytes.Equal(again, got) {
		t.Fatalf("the decoded message changed with its input buffer")
	}
}

func FuzzDecode(f *testing.F) {
	seedGolden(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		checkDecoded(t, b, m, err)
	})
}

// FuzzDecodeSealed puts fuzzed bytes after a valid AUTH header and sequence
// number, so the inner decoder is reached far more often than from scratch.
func FuzzDecodeSealed(f *testing.F) {
	f.Add(unhex(f, upd), []byte(strings.Repeat("\xaa", 32)))
	f.Add(unhex(f, "01 04 00 18 | 9c 40 06 03 | 0a 0a 0a 0a | 14 14 14 14 | 14 14 14 14 | 00 16 00 16"), make([]byte, 32))
	f.Fuzz(func(t *testing.T, inner, tagBytes []byte) {
		n := 12 + len(inner) + len(tagBytes)
		if n > MaxLen {
			return
		}
		b := append([]byte{1, byte(CmdSealed), byte(n >> 8), byte(n), 0, 0, 0, 0, 0, 0, 0, 7}, inner...)
		b = append(b, tagBytes...)
		orig := append([]byte(nil), b...)
		m, err := Decode(b)
		checkDecoded(t, b, m, err)
		if err == nil {
			// The fuzzer splits inner and tag anywhere; the tag is always
			// the last 32 bytes of the message.
			s := m.(*Sealed)
			if s.Seq != 7 || !bytes.Equal(s.Tag[:], orig[len(orig)-TagLen:]) {
				t.Fatalf("accepted %x as %#v: wrong sequence number or tag", orig, s)
			}
		}
	})
}

// FuzzDecodeBatch builds a batch from fuzzed entries behind a valid header
// with a fuzzed count.
func FuzzDecodeBatch(f *testing.F) {
	f.Add(uint16(1), unhex(f, upd))
	f.Add(uint16(2), append(unhex(f, upd), unhex(f, upd)...))
	f.Add(uint16(3), unhex(f, upd))
	f.Fuzz(func(t *testing.T, count uint16, entries []byte) {
		n := batchFixed + len(entries)
		if n > MaxLen {
			return
		}
		b := append([]byte{1, byte(CmdBatch), byte(n >> 8), byte(n), byte(count >> 8), byte(count), 0, 0}, entries...)
		m, err := Decode(b)
		checkDecoded(t, b, m, err)
		if err == nil && len(m.(*Batch).Entries) != int(count) {
			t.Fatalf("accepted a batch of %d entries whose count says %d", len(m.(*Batch).Entries), count)
		}
	})
}

// FuzzReadFrame feeds a stream of messages to ReadMessage: it never panics,
// and every message it returns is one Decode accepts on its own.
func FuzzReadFrame(f *testing.F) {
	seedGolden(f)
	f.Add(append(unhex(f, upd), unhex(f, upd)...))
	f.Fuzz(func(t *testing.T, stream []byte) {
		r := bytes.NewReader(stream)
		for {
			b, err := ReadFrame(r)
			if err != nil {
				return
			}
			m, err := Decode(b)
			checkDecoded(t, b, m, err)
		}
	})
}
