package vcmp

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"
)

// connN is the n-th of many connections between the client and server hosts.
func connN(n int) Tuple {
	return Tuple{TCP, netip.AddrPortFrom(client.Addr(), uint16(10000+n)), server}
}

func TestBatchesPackAndSplit(t *testing.T) {
	var msgs []Message
	for i := range 10000 {
		s, err := Seal(&Update{Record{Conn: connN(i), Phys: ap("30.30.30.30:1")}}, Secret{}, 1)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, s)
	}
	bs, err := Batches(msgs)
	if err != nil {
		t.Fatal(err)
	}
	perBatch := (MaxLen - batchFixed) / (sealedFixed + recordLen) // 963 sealed updates
	if want := (len(msgs) + perBatch - 1) / perBatch; len(bs) != want {
		t.Fatalf("%d batches, want %d", len(bs), want)
	}
	n := 0
	for i, b := range bs {
		enc, err := Encode(b)
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		if i < len(bs)-1 && len(b.Entries) != perBatch {
			t.Fatalf("batch %d holds %d, want %d (%d bytes)", i, len(b.Entries), perBatch, len(enc))
		}
		for _, e := range b.Entries {
			if e != msgs[n] {
				t.Fatalf("entry %d out of order", n)
			}
			n++
		}
	}
	if n != len(msgs) {
		t.Fatalf("%d entries in the batches, %d messages", n, len(msgs))
	}
	// Queries are answered by longer answers: their batch leaves room for them.
	var qs []Message
	for i := range 3000 {
		qs = append(qs, Query(Record{Conn: connN(i), Phys: client}))
	}
	qb, err := Batches(qs)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range qb {
		ans := &Batch{}
		for _, e := range b.Entries {
			ans.Entries = append(ans.Entries, &LocAnswer{Record: e.(*LocQuery).Record, Status: LocFound, Peer: server})
		}
		if _, err := Encode(ans); err != nil {
			t.Fatalf("the answer to a %d-query batch does not fit: %v", len(b.Entries), err)
		}
	}
	if _, err := Batches([]Message{&Batch{}}); err == nil {
		t.Fatal("a batch was batched")
	}
}

func TestTransportFramesOverAPipe(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	msgs := []Message{golden[0].msg, golden[2].msg, golden[10].msg, golden[11].msg}
	go func() {
		for _, m := range msgs {
			if err := WriteMessage(a, m); err != nil {
				a.Close()
				return
			}
		}
		a.Write([]byte{2, 3, 0, 8, 0, 0, 0, 0}) // a version-2 message: framed, then refused
		a.Write(unhex(t, upd))                  // the stream is still in step after it
		a.Close()
	}()
	for i, want := range msgs {
		got, err := ReadMessage(b)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		w, _ := Encode(want)
		g, _ := Encode(got)
		if !bytes.Equal(w, g) {
			t.Fatalf("message %d: got %x want %x", i, g, w)
		}
	}
	if _, err := ReadMessage(b); !errors.Is(err, ErrVersion) {
		t.Fatalf("version-2 message: %v, want ErrVersion", err)
	}
	if m, err := ReadMessage(b); err != nil || m.Command() != CmdUpdate {
		t.Fatalf("the message after the refused one: %v %v", m, err)
	}
	if _, err := ReadMessage(b); err != io.EOF {
		t.Fatalf("end of stream: %v, want io.EOF", err)
	}
}

func TestReadFrameRefusesAShortLength(t *testing.T) {
	if _, err := ReadFrame(bytes.NewReader([]byte{1, 3, 0, 2})); !errors.Is(err, ErrLength) {
		t.Fatalf("length 2: %v, want ErrLength", err)
	}
	if _, err := ReadFrame(bytes.NewReader(unhex(t, upd)[:10])); err == nil || err == io.EOF {
		t.Fatalf("a message cut short: %v, want an error other than EOF", err)
	}
}

// peerEnd is one end's keyed connections, as the daemon will hold them.
type peerEnd struct {
	keys map[Tuple]Keys
	win  map[Tuple]*Window
	seq  map[Tuple]uint64
	phys map[Tuple]netip.AddrPort // the peer's physical endpoint, as translated
	self netip.AddrPort
}

func newPeerEnd(self netip.AddrPort) *peerEnd {
	return &peerEnd{keys: map[Tuple]Keys{}, win: map[Tuple]*Window{}, seq: map[Tuple]uint64{}, phys: map[Tuple]netip.AddrPort{}, self: self}
}

func (p *peerEnd) seal(t *testing.T, m Message, conn Tuple) *Sealed {
	t.Helper()
	p.seq[conn]++
	s, err := Seal(m, p.keys[conn].Send, p.seq[conn])
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// answer is the stationary end's handler: open the sealed update with the
// connection's key, apply it, answer with a sealed reply.
func (p *peerEnd) answer(t *testing.T) Handler {
	return func(m Message) Message {
		s, ok := m.(*Sealed)
		if !ok {
			return &UpdateReply{Status: UpdateRefused}
		}
		conn := s.Inner.(*Update).Conn.Reverse()
		k, ok := p.keys[conn]
		if !ok {
			return &UpdateReply{Record: Record{Conn: conn, Phys: p.self}, Status: UpdateUnknown}
		}
		in, err := Open(s, &k.Recv, p.win[conn], true)
		if err != nil {
			return &UpdateReply{Record: Record{Conn: conn, Phys: p.self}, Status: UpdateRefused}
		}
		p.phys[conn] = in.(*Update).Phys
		return p.seal(t, &UpdateReply{Record: Record{Conn: conn, Phys: p.self}}, conn)
	}
}

// TestRestoreManyConnectionsInOneRoundTrip: a client with N keyed
// connections to one server moves; it seals N updates and sends them as
// batches on one stream. The server answers a batch only after it has read
// every batch, which deadlocks any sender that waits for an answer before
// sending more: the exchange finishing proves one round trip for all N.
// Every connection's key, sequence number and reply are checked, and a
// connection with a wrong key is refused alone.
func TestRestoreManyConnectionsInOneRoundTrip(t *testing.T) {
	const n = 3000
	cli, srv := newPeerEnd(client), newPeerEnd(server)
	for i := range n {
		c := connN(i)
		a, err := GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		b, err := GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if cli.keys[c], err = DeriveKeys(a, PublicKey(b), c); err != nil {
			t.Fatal(err)
		}
		if srv.keys[c.Reverse()], err = DeriveKeys(b, PublicKey(a), c.Reverse()); err != nil {
			t.Fatal(err)
		}
		cli.win[c], srv.win[c.Reverse()] = &Window{}, &Window{}
	}
	bad := connN(7)
	cli.keys[bad] = Keys{Send: Secret{1}, Recv: cli.keys[bad].Recv} // this one's sender lost its key

	newPhys := ap("30.30.30.30:40000")
	var msgs []Message
	for i := range n {
		msgs = append(msgs, cli.seal(t, &Update{Record{Conn: connN(i), Phys: newPhys}}, connN(i)))
	}
	batches, _ := Batches(msgs)

	a, b := net.Pipe()
	defer a.Close()
	served := make(chan error, 1)
	go func() {
		defer b.Close()
		// Read every batch before answering any.
		var got []*Batch
		for range batches {
			m, err := ReadMessage(b)
			if err != nil {
				served <- err
				return
			}
			got = append(got, m.(*Batch))
		}
		h := srv.answer(t)
		for _, bt := range got {
			ans := &Batch{}
			for _, e := range bt.Entries {
				ans.Entries = append(ans.Entries, h(e))
			}
			if err := WriteMessage(b, ans); err != nil {
				served <- err
				return
			}
		}
		served <- nil
	}()
	done := make(chan struct{})
	var replies []Message
	var xerr error
	go func() {
		replies, xerr = Exchange(a, msgs)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		a.Close()
		t.Fatal("the exchange did not finish: the sender waits for answers before sending everything")
	}
	if xerr != nil {
		t.Fatal(xerr)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if len(replies) != n {
		t.Fatalf("%d replies to %d updates", len(replies), n)
	}
	for i, r := range replies {
		c := connN(i)
		if c == bad {
			if ur, ok := r.(*UpdateReply); !ok || ur.Status != UpdateRefused {
				t.Fatalf("connection %v with a wrong key: %#v, want refused", c, r)
			}
			if _, moved := srv.phys[c.Reverse()]; moved {
				t.Fatalf("connection %v with a wrong key was updated", c)
			}
			continue
		}
		in, err := Open(r, ptr(cli.keys[c].Recv), cli.win[c], true)
		if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		ur := in.(*UpdateReply)
		if ur.Status != UpdateOK || ur.Conn != c.Reverse() || ur.Phys != server {
			t.Fatalf("reply %d: %+v", i, ur)
		}
		if got := srv.phys[c.Reverse()]; got != newPhys {
			t.Fatalf("connection %d: the server translates to %v, want %v", i, got, newPhys)
		}
	}
	t.Logf("%d connections restored in %d batches on one stream", n, len(batches))
}

func ptr[T any](v T) *T { return &v }

func TestServeBatchesAnswersInOrder(t *testing.T) {
	a, b := net.Pipe()
	d := NewDirectory(nil)
	go func() {
		ServeBatches(b, func(m Message) Message {
			ans, err := d.Answer(m)
			if err != nil {
				return &LocAnswer{Status: LocRefused}
			}
			return ans
		})
		b.Close()
	}()
	var qs []Message
	for i := range 5 {
		qs = append(qs, Query(Record{Conn: connN(i), Phys: client}))
	}
	qs = append(qs, Query(Record{Conn: connN(2).Reverse(), Phys: server}))
	out, err := Exchange(a, qs)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	for i, m := range out[:5] {
		if la := m.(*LocAnswer); la.Status != LocStored || la.Conn != connN(i) {
			t.Fatalf("answer %d: %+v", i, la)
		}
	}
	if la := out[5].(*LocAnswer); la.Status != LocFound || la.Peer != client {
		t.Fatalf("the last query, for connection 2's client: %+v", la)
	}
}
