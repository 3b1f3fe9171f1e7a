package store

import (
	"context"
	"testing"
)

// TestMemoryTxnIsOneRevision: a transaction's writes share one revision
// and count as one write, an event watch brings them together, and a key
// named twice is refused with nothing written, as etcd does.
func TestMemoryTxnIsOneRevision(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := NewMemory()
	if err := m.Put(ctx, "/p/gone", []byte("x")); err != nil {
		t.Fatal(err)
	}
	w0, r0 := m.Writes(), m.Rev()
	events := m.WatchEvents(ctx, "/p/", r0)
	rev, err := m.Txn(ctx, []Op{{Key: "/p/a", Value: []byte("1")}, {Key: "/p/b", Value: []byte("2")}, {Key: "/p/gone", Delete: true}})
	if err != nil || rev != r0+1 || m.Writes() != w0+1 {
		t.Fatalf("txn: rev %d (%v), writes %d, want rev %d and one write", rev, err, m.Writes()-w0, r0+1)
	}
	b := <-events
	if len(b.Events) != 3 || b.Err != nil {
		t.Fatalf("watch brought %+v, want the transaction's 3 changes", b)
	}
	for _, e := range b.Events {
		if e.Rev != rev {
			t.Fatalf("event %+v at revision %d, want %d", e, e.Rev, rev)
		}
	}
	if _, err := m.Txn(ctx, []Op{{Key: "/p/c", Value: []byte("1")}, {Key: "/p/c", Delete: true}}); err == nil {
		t.Fatal("a transaction naming /p/c twice was taken")
	}
	if _, err := m.Get(ctx, "/p/c"); err != ErrNotFound || m.Rev() != rev {
		t.Fatalf("after the refused transaction: get %v, rev %d, want nothing written", err, m.Rev())
	}
}
