package vnatd

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/vcmp"
)

// freezeLog is a Freezer's cgroup: what it was set to, in order.
type freezeLog struct {
	mu  sync.Mutex
	set []bool
	// thawed, if set, is closed at the first thaw.
	thawed chan struct{}
}

func (f *freezeLog) Set(frozen bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.set = append(f.set, frozen)
	if !frozen && f.thawed != nil {
		close(f.thawed)
		f.thawed = nil
	}
	return nil
}

func (f *freezeLog) frozen() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.set) > 0 && f.set[len(f.set)-1]
}

// A peer that suspends and stays away: b (stationary, secondary) helps
// both connections (keepalive helper, cgroup frozen) until --max-away
// (here 10 minutes on a fake clock) and not a moment less; then it stops
// both helpers, thaws the application, counts both and logs why once
// (rate-limited). The connections stay suspended: when a does come back,
// its update still settles them, and nothing is stopped twice. With
// --max-away 0 the helpers run as long as the peer is away.
func TestMaxAwayStopsTheHelpersOfAPeerThatNeverComesBack(t *testing.T) {
	for _, maxAway := range []time.Duration{10 * time.Minute, 0} {
		t.Run(fmt.Sprintf("max-away=%v", maxAway), func(t *testing.T) {
			var mu sync.Mutex
			clk := time.Unix(3_000_000, 0)
			now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clk }
			advance := func(d time.Duration) { mu.Lock(); clk = clk.Add(d); mu.Unlock() }
			n := newNetwork()
			hb, cg := &fakeHelper{}, &freezeLog{}
			a := n.add(t, "a", "10.0.1.1", Config{})
			b := n.add(t, "b", "10.0.2.2", Config{Now: now, MaxAway: maxAway, Helpers: []Helper{hb, &Freezer{Set: cg.Set}}})
			ta, tb := connect(a, b, 40000)
			ta2, tb2 := connect(a, b, 40001)
			syncAll(t, a, b)
			if k, err := a.e.Suspend(t.Context(), nil); err != nil || k != 2 {
				t.Fatalf("suspend: %d, %v; want 2", k, err)
			}
			helped := func() []vcmp.Tuple {
				got := hb.running()
				slices.SortFunc(got, func(x, y vcmp.Tuple) int { return strings.Compare(x.String(), y.String()) })
				return got
			}
			want := []vcmp.Tuple{tb, tb2}
			if got := helped(); !slices.Equal(got, want) || !cg.frozen() {
				t.Fatalf("b after a's suspend: helping %v, frozen %v; want %v, frozen", got, cg.frozen(), want)
			}

			advance(10*time.Minute - time.Second)
			if k := b.e.ExpireAway(); k != 0 {
				t.Fatalf("ExpireAway a second before max-away stopped %d, want 0", k)
			}
			if got := helped(); !slices.Equal(got, want) || !cg.frozen() || !state(t, b, tb).Helper {
				t.Fatalf("b a second before max-away: helping %v, frozen %v, %+v; want both helped, frozen", got, cg.frozen(), state(t, b, tb))
			}

			advance(time.Second)
			k := b.e.ExpireAway()
			if maxAway == 0 {
				advance(1000 * time.Hour)
				k += b.e.ExpireAway()
				if got := helped(); k != 0 || !slices.Equal(got, want) || !cg.frozen() {
					t.Fatalf("max-away 0 after 1000 h: stopped %d, helping %v, frozen %v; want still helping, frozen", k, got, cg.frozen())
				}
				wantCounter(t, b, "away_expired", 0)
				return
			}
			if k != 2 {
				t.Fatalf("ExpireAway at max-away stopped %d, want 2", k)
			}
			if got := helped(); len(got) != 0 || cg.frozen() {
				t.Fatalf("b after max-away: helping %v, frozen %v; want none, thawed", got, cg.frozen())
			}
			if s := state(t, b, tb); s.Helper || !s.AwayExpired || s.State != "suspended" {
				t.Errorf("b's status after max-away: %+v; want no helper, away_expired, still suspended", s)
			}
			wantCounter(t, b, "away_expired", 2)
			wantCounter(t, b, "helpers_stopped", 2)
			if l := strings.Count(b.logs.String(), "peer away longer than --max-away"); l != 1 {
				t.Errorf("two expiries in one second logged %d times, want 1 (rate-limited):\n%s", l, b.logs)
			}
			advance(time.Hour)
			if k := b.e.ExpireAway(); k != 0 {
				t.Errorf("a later ExpireAway stopped %d again, want 0", k)
			}
			wantCounter(t, b, "away_expired", 2)

			// a comes back after all: the update still settles both.
			old, new := n.move(a, "10.0.3.3")
			if err := a.e.Restore(context.Background(), old, new); err != nil {
				t.Fatal(err)
			}
			for _, c := range [][2]vcmp.Tuple{{ta, tb}, {ta2, tb2}} {
				wantPhys(t, a, c[0], new, b.addr)
				wantPhys(t, b, c[1], b.addr, new)
				if s := state(t, b, c[1]); s.AwayExpired || s.Helper {
					t.Errorf("b after a came back: %+v; want settled, no helper", s)
				}
			}
			wantCounter(t, b, "helpers_stopped", 2)
			wantCounter(t, b, "helper_errors", 0)
			if got := cg.set; !slices.Equal(got, []bool{true, false}) {
				t.Errorf("b's cgroup was set %v, want frozen once and thawed once", got)
			}
		})
	}
}

// The daemon's loop (expireAway, started by Run) stops the helpers on its
// own, on the real clock, soon after a short max-away; the connection
// whose peer stays is not touched.
func TestMaxAwayLoopStopsTheHelpersOnItsOwn(t *testing.T) {
	n := newNetwork()
	thawed := make(chan struct{})
	hb, cg := &fakeHelper{}, &freezeLog{thawed: thawed}
	a := n.add(t, "a", "10.0.1.1", Config{})
	b := n.add(t, "b", "10.0.2.2", Config{MaxAway: 200 * time.Millisecond, Helpers: []Helper{hb, &Freezer{Set: cg.Set}}})
	ta, tb := connect(a, b, 40000)
	_, tb2 := connect(a, b, 40001)
	syncAll(t, a, b)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { expireAway(ctx, b.e); close(done) }()
	defer func() { cancel(); <-done }()
	start := time.Now()
	if _, err := a.e.Suspend(t.Context(), func(v vcmp.Tuple) bool { return v == ta }); err != nil {
		t.Fatal(err)
	}
	if !cg.frozen() {
		t.Fatal("b not frozen after a's suspend")
	}
	select {
	case <-thawed:
	case <-time.After(5 * time.Second):
		t.Fatalf("still frozen after 5 s (max-away 200 ms)\n%s", b.logs)
	}
	// The freezer is the last helper: the keepalive one stopped before it.
	if got := hb.running(); len(got) != 0 {
		t.Errorf("helpers still running %v after the thaw", got)
	}
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Errorf("helpers stopped after %v, before max-away (200 ms)", took)
	}
	if s := state(t, b, tb); !s.AwayExpired || s.State != "suspended" {
		t.Errorf("b: %+v, want away_expired, suspended", s)
	}
	if s := state(t, b, tb2); s.AwayExpired || s.State != "active" {
		t.Errorf("b: the other connection %+v, want untouched (active)", s)
	}
	wantCounter(t, b, "away_expired", 1)
}

// A negative --max-away is refused before anything is set up, naming it.
func TestRunRefusesANegativeMaxAway(t *testing.T) {
	err := Run(t.Context(), Options{Iface: "no-such-iface-vwalk", MaxAway: -time.Second})
	if err == nil || !strings.Contains(err.Error(), "--max-away -1s") {
		t.Fatalf("Run with --max-away -1s: %v, want an error naming it", err)
	}
}
