package vnatd

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/vcmp"
	"github.com/onehop/onehop/internal/vnatloc"
)

// addWithServer is network.add, but the address loc is a real location
// server (vnatloc, over a memory store) rather than another daemon.
func addWithServer(t *testing.T, n *network, name, addr string, cfg Config, loc netip.Addr, svc *vnatloc.Service) *node {
	t.Helper()
	nd := &node{name: name, addr: netip.MustParseAddr(addr), tr: &fakeTr{xlate: map[vcmp.Tuple]vcmp.Tuple{}}, logs: &bytes.Buffer{}}
	cfg.Logger = slog.New(slog.NewTextHandler(nd.logs, nil))
	cfg.LocationServers = []netip.Addr{loc}
	nd.e = New(cfg, nd.tr, func(ctx context.Context, a netip.Addr) (io.ReadWriteCloser, error) {
		if a != loc {
			return n.dial(ctx, nd, a)
		}
		n.mu.Lock()
		n.dials[a]++
		src := nd.addr
		n.mu.Unlock()
		c, s := net.Pipe()
		go func() { defer s.Close(); svc.ServeStream(context.Background(), s, src) }()
		return c, nil
	})
	n.mu.Lock()
	n.at[nd.addr] = nd
	n.mu.Unlock()
	return nd
}

// TestLocationClientKeepsMovedEndsAtTheServer: both ends of a connection
// move at once (both old places gone): they meet at the location server
// (vnatloc, which checks that each stores only where it is). Then each
// daemon's location client keeps its record there: stored within one step,
// nothing sent until the refresh is due, refreshed, and released when the
// connection closes, which frees the virtual address for the controller.
func TestLocationClientKeepsMovedEndsAtTheServer(t *testing.T) {
	mem := store.NewMemory()
	clk := time.Unix(2_000_000, 0)
	now := func() time.Time { return clk }
	svc := vnatloc.New(mem, vnatloc.Config{Now: now, Logger: slog.New(slog.DiscardHandler)})
	loc := netip.MustParseAddr("192.168.100.1")
	n := newNetwork()
	a := addWithServer(t, n, "a", "10.1.1.2", Config{Now: now}, loc, svc)
	b := addWithServer(t, n, "b", "10.1.2.2", Config{Now: now}, loc, svc)
	ta, tb := connect(a, b, 40000)
	keyAll(t, a, b)

	aOld, aNew := n.move(a, "10.1.3.2")
	bOld, bNew := n.move(b, "10.1.4.2")
	if err := a.e.Restore(t.Context(), aOld, aNew); err != nil {
		t.Fatal(err)
	}
	if s := state(t, a, ta); s.State != "suspended" {
		t.Fatalf("a after restoring first: %+v, want suspended (stored at the server)", s)
	}
	if err := b.e.Restore(t.Context(), bOld, bNew); err != nil {
		t.Fatal(err)
	}
	wantPhys(t, a, ta, aNew, bNew)
	wantPhys(t, b, tb, bNew, aNew)

	held := func() map[netip.Addr]bool {
		t.Helper()
		h, err := vnatloc.Held(t.Context(), mem, clk)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	if h := held(); !h[aOld] || h[bOld] {
		t.Fatalf("held %v after the walks, want only a's %v (b found a, storing nothing)", h, aOld)
	}
	la := NewLocationClient(a.e, []netip.Addr{loc})
	lb := NewLocationClient(b.e, []netip.Addr{loc})
	for _, l := range []*LocationClient{la, lb} {
		if got, err := l.Step(t.Context()); err != nil || got != 1 {
			t.Fatalf("first step stored %d (%v), want 1", got, err)
		}
	}
	if h := held(); !h[aOld] || !h[bOld] {
		t.Fatalf("held %v, want both virtual addresses %v %v", h, aOld, bOld)
	}
	if got, _ := la.Step(t.Context()); got != 0 {
		t.Fatalf("a step with nothing due stored %d, want 0", got)
	}
	refreshed := svc.Counters()["refreshed"]
	clk = clk.Add(vcmp.RefreshEvery)
	if got, _ := la.Step(t.Context()); got != 1 || svc.Counters()["refreshed"] != refreshed+1 {
		t.Fatalf("the refresh stored %d, server refreshed %d; want 1 and %d", got, svc.Counters()["refreshed"], refreshed+1)
	}
	// b's record, not refreshed, expires a lifetime after it was stored;
	// a's, refreshed, lives on.
	clk = clk.Add(vcmp.RecordLifetime - vcmp.RefreshEvery)
	if h := held(); !h[aOld] || h[bOld] {
		t.Fatalf("held %v, want a's (refreshed) and not b's (expired)", h)
	}

	// The connection closes at a: forgotten, then released.
	a.tr.open = nil
	if err := a.e.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := la.Step(t.Context()); err != nil {
		t.Fatal(err)
	}
	if held()[aOld] {
		t.Fatalf("held %v after the connection closed, want %v released", held(), aOld)
	}
	if c := a.e.Counters(); c["locations_released"] != 1 {
		t.Fatalf("a's counters %v, want locations_released 1", c)
	}
}

// A location server that cannot be reached is left alone for
// RetryUnreachable (serverRetry), each time: the client's steps before then
// do not dial it.
func TestLocationClientLeavesAnUnreachableServerAloneForRetryUnreachable(t *testing.T) {
	clk := time.Unix(2_000_000, 0)
	now := func() time.Time { return clk }
	loc := netip.MustParseAddr("192.168.100.1") // no daemon there: every dial fails
	n := newNetwork()
	a := n.add(t, "a", "10.1.1.2", Config{Now: now})
	b := n.add(t, "b", "10.1.2.2", Config{Now: now})
	connect(a, b, 40000)
	keyAll(t, a, b)
	old, new := n.move(a, "10.1.3.2")
	if err := a.e.Restore(t.Context(), old, new); err != nil {
		t.Fatal(err)
	}
	l := NewLocationClient(a.e, []netip.Addr{loc})
	for i, step := range []struct {
		after time.Duration // since the step before
		asked bool          // the step dials the server (and fails)
	}{
		{0, true},
		{RetryUnreachable - time.Nanosecond, false},
		{time.Nanosecond, true},
		{RetryUnreachable / 2, false},
		{RetryUnreachable / 2, true},
	} {
		clk = clk.Add(step.after)
		n.mu.Lock()
		before := n.dials[loc]
		n.mu.Unlock()
		_, err := l.Step(t.Context())
		n.mu.Lock()
		asked := n.dials[loc] > before
		n.mu.Unlock()
		if asked != step.asked || (err != nil) != step.asked {
			t.Errorf("step %d (%v after the one before): dialled %v, err %v; want dialled %v", i+1, step.after, asked, err, step.asked)
		}
	}
}
