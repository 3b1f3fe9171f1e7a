package vcmp

import (
	"errors"
	"fmt"
	"io"
)

// WriteMessage encodes m and writes it to w in one Write.
func WriteMessage(w io.Writer, m Message) error {
	b, err := Encode(m)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("vcmp: write %s: %w", m.Command(), err)
	}
	return nil
}

// ReadFrame reads one message's bytes from a stream, of any version: the
// header word's layout is frozen, so the stream stays in step even past a
// message this end cannot decode. io.EOF means the stream ended cleanly
// between messages.
func ReadFrame(r io.Reader) ([]byte, error) {
	var h [HeaderLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		return nil, fmt.Errorf("vcmp: read header: %w", err)
	}
	_, _, n, _ := Header(h[:])
	if n < HeaderLen {
		return nil, fieldErr(0, "Length", 2, ErrLength, "length field %d, shorter than the header word; the stream cannot be resynchronised", n)
	}
	b := make([]byte, n)
	copy(b, h[:])
	if _, err := io.ReadFull(r, b[HeaderLen:]); err != nil {
		return nil, fmt.Errorf("vcmp: read %d-byte message: %w", n, err)
	}
	return b, nil
}

// ReadMessage reads and decodes one message.
func ReadMessage(r io.Reader) (Message, error) {
	b, err := ReadFrame(r)
	if err != nil {
		return nil, err
	}
	return Decode(b)
}
