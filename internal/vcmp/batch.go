package vcmp

import (
	"fmt"
	"io"
)

// Batches packs messages for one peer into as few VCMP_BATCH messages as the
// 16-bit length allows, in order. Restoring N connections with one peer is
// then ceil(N / per-batch) messages written back to back on one stream and
// answered in the same order: one round trip per peer, not per connection
// (issue 10 item 10; the paper's prototype did one exchange per connection).
func Batches(msgs []Message) ([]*Batch, error) {
	var out []*Batch
	cur := &Batch{}
	size := batchFixed
	for i, m := range msgs {
		if m == nil {
			return nil, fmt.Errorf("vcmp: batch: message %d is nil", i)
		}
		if m.Command() == CmdBatch {
			return nil, fmt.Errorf("vcmp: batch: message %d is itself a batch", i)
		}
		n := answerRoom(m)
		if batchFixed+n > MaxLen {
			return nil, fmt.Errorf("vcmp: batch: message %d (%s) is %d bytes, too big for any batch", i, m.Command(), n)
		}
		if size+n > MaxLen || len(cur.Entries) == 0xffff {
			out = append(out, cur)
			cur, size = &Batch{}, batchFixed
		}
		cur.Entries = append(cur.Entries, m)
		size += n
	}
	if len(cur.Entries) > 0 {
		out = append(out, cur)
	}
	return out, nil
}

// answerRoom is the room a message takes in a batch: its own size or its
// answer's, whichever is larger, so the answering batch fits in MaxLen too.
func answerRoom(m Message) int {
	switch m.(type) {
	case *LocQuery, *LocStore:
		return recordLen + 8 // answered by a VCMP_LOC_ANSWER
	}
	return m.size() // answered by a message of the same size (or a smaller refusal)
}

// Exchange sends msgs to a peer over one stream, packed by Batches, and
// returns the peer's answers in the same order. It writes every batch before
// it waits for any answer (the writes run beside the reads), so the whole
// exchange costs one round trip however many connections it carries.
func Exchange(rw io.ReadWriter, msgs []Message) ([]Message, error) {
	batches, err := Batches(msgs)
	if err != nil {
		return nil, err
	}
	werr := make(chan error, 1)
	go func() {
		for _, b := range batches {
			if err := WriteMessage(rw, b); err != nil {
				werr <- err
				return
			}
		}
		werr <- nil
	}()
	var out []Message
	var rerr error
	for i, sent := range batches {
		m, err := ReadMessage(rw)
		if err != nil {
			rerr = fmt.Errorf("vcmp: exchange: answer to batch %d of %d: %w", i+1, len(batches), err)
			break
		}
		ans, ok := m.(*Batch)
		if !ok {
			rerr = fmt.Errorf("vcmp: exchange: answer to batch %d is %s, want VCMP_BATCH", i+1, m.Command())
			break
		}
		if len(ans.Entries) != len(sent.Entries) {
			rerr = fmt.Errorf("vcmp: exchange: batch %d had %d entries, its answer %d", i+1, len(sent.Entries), len(ans.Entries))
			break
		}
		out = append(out, ans.Entries...)
	}
	if rerr != nil {
		// The writer may be blocked on a peer that stopped reading; the
		// caller closes the stream, which ends it.
		return nil, rerr
	}
	if err := <-werr; err != nil {
		return nil, err
	}
	return out, nil
}

// Handler answers one message of a batch. It must return an answer for
// every entry, so answers line up with requests.
type Handler func(Message) Message

// BatchHandler answers the entries of one batch at once (answers[i] for
// entries[i]; a nil answer is an error), so that what they change can be
// applied together.
type BatchHandler func(entries []Message) []Message

// ServeBatches answers VCMP_BATCH messages read from rw with one VCMP_BATCH
// each, until the stream ends (nil on a clean end between messages).
func ServeBatches(rw io.ReadWriter, h Handler) error {
	return ServeWholeBatches(rw, func(es []Message) []Message {
		out := make([]Message, len(es))
		for i, e := range es {
			if out[i] = h(e); out[i] == nil {
				break
			}
		}
		return out
	})
}

// ServeWholeBatches is ServeBatches with a handler given each batch whole.
func ServeWholeBatches(rw io.ReadWriter, h BatchHandler) error {
	for {
		m, err := ReadMessage(rw)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		b, ok := m.(*Batch)
		if !ok {
			return fmt.Errorf("vcmp: serve: got %s, want VCMP_BATCH", m.Command())
		}
		ans := &Batch{Entries: h(b.Entries)}
		if len(ans.Entries) != len(b.Entries) {
			return fmt.Errorf("vcmp: serve: %d answers to %d entries", len(ans.Entries), len(b.Entries))
		}
		for i, e := range b.Entries {
			if ans.Entries[i] == nil {
				return fmt.Errorf("vcmp: serve: no answer to entry %d (%s)", i, e.Command())
			}
		}
		if err := WriteMessage(rw, ans); err != nil {
			return err
		}
	}
}
