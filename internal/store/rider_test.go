package store

import (
	"testing"
)

// A rider goes into the transaction of the first write that lands: a
// PutIfUnchanged that does not write leaves it for the next, which takes
// it in its one transaction; no later write takes it again, nor any after
// Close.
func TestRiderLandsWithTheFirstWriteThatLands(t *testing.T) {
	m := NewMemory()
	ctx := t.Context()
	var asked int
	var outcomes []bool
	r := NewRider(func(room int) ([]Op, error) {
		asked++
		if room != MaxTxnOps-1 {
			t.Errorf("room %d for a write of one key, want %d", room, MaxTxnOps-1)
		}
		return []Op{{Key: "audit", Value: []byte("entry")}}, nil
	}, func(_ []Op, written bool, err error) {
		if err != nil {
			t.Error(err)
		}
		outcomes = append(outcomes, written)
	})
	rctx := WithRider(ctx, r)
	if err := m.Put(ctx, "p/taken", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if ok, err := m.PutIfUnchanged(rctx, "p/", 0, "p/mine", []byte("y")); ok || err != nil {
		t.Fatalf("PutIfUnchanged over a changed prefix: %v %v, want not written", ok, err)
	}
	if _, err := m.Get(ctx, "audit"); err != ErrNotFound {
		t.Fatalf("the rider landed with a write that did not: %v", err)
	}
	before := m.Writes()
	if err := m.Delete(rctx, "p/taken"); err != nil {
		t.Fatal(err)
	}
	if v, err := m.Get(ctx, "audit"); err != nil || string(v) != "entry" || m.Writes() != before+1 {
		t.Fatalf("after the delete: audit %q (%v), %d transactions; want the entry, in one", v, err, m.Writes()-before)
	}
	if err := m.Delete(ctx, "audit"); err != nil {
		t.Fatal(err)
	}
	if err := m.Put(rctx, "q", []byte("z")); err != nil {
		t.Fatal(err)
	}
	if !r.Close() {
		t.Error("Close says no write carried the rider")
	}
	if _, err := m.Txn(rctx, []Op{{Key: "r", Value: []byte("1")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Get(ctx, "audit"); err != ErrNotFound || asked != 2 || len(outcomes) != 2 || outcomes[0] || !outcomes[1] {
		t.Errorf("the rider was written again (%v), or asked %d times with outcomes %v: want twice, not written then written", err, asked, outcomes)
	}
}
