package vnatd

import (
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/backoff"
)

// The restore report counts what one move did and times it from the moment
// the address change was seen; status carries it.
func TestRestoreReportCountsTheMoveAndTimesItFromTheAddressChange(t *testing.T) {
	n := newNetwork()
	a := n.add(t, "a", "10.0.1.1", Config{})
	b := n.add(t, "b", "10.0.2.2", Config{})
	for i := range 30 {
		connect(a, b, uint16(40000+i))
	}
	keyAll(t, a, b)
	if r := a.e.LastRestore(); r != nil {
		t.Fatalf("a report before any move: %+v", r)
	}
	old, new := n.move(a, "10.0.3.3")
	seen := time.Now().Add(-5 * time.Millisecond)
	r, err := a.e.RestoreAndReport(t.Context(), old, new, seen)
	if err != nil {
		t.Fatal(err)
	}
	if r.Old != "10.0.1.1" || r.New != "10.0.3.3" || r.Conns != 30 || r.States["migrated"] != 30 || r.Migrated != 30 || r.Aborted != 0 {
		t.Fatalf("report %+v, want 30 connections migrated from 10.0.1.1 to 10.0.3.3", r)
	}
	if !r.Seen.Equal(seen) || r.TookUS < 5000 || r.Done.Sub(r.Seen).Microseconds() != r.TookUS {
		t.Fatalf("report times seen %v done %v took %d µs; want from seen, at least 5 ms", r.Seen, r.Done, r.TookUS)
	}
	got, err := a.e.answer(t.Context(), Request{Op: "status"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Restore == nil || got.Restore.Conns != 30 {
		t.Fatalf("status restore %+v, want the report", got.Restore)
	}
	if s := got.Restore.String(); !strings.Contains(s, "30 connection(s) (30 migrated)") {
		t.Fatalf("report line %q", s)
	}
	// A move whose peer is gone: the report says the connections aborted.
	n2 := newNetwork()
	c := n2.add(t, "c", "10.0.1.1", Config{WalkRetry: backoff.Backoff{For: time.Millisecond}})
	d := n2.add(t, "d", "10.0.2.2", Config{})
	connect(c, d, 40000)
	syncAll(t, c, d)
	n2.mu.Lock()
	delete(n2.at, d.addr) // d is gone: nobody answers at its place
	n2.mu.Unlock()
	old, new = n2.move(c, "10.0.3.3")
	r, _ = c.e.RestoreAndReport(t.Context(), old, new, time.Now())
	if r.Aborted != 1 || r.States["aborted"] != 1 || r.Migrated != 0 {
		t.Fatalf("report with the peer gone %+v, want 1 aborted", r)
	}
}
