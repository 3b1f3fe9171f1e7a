package vnatd

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/onehop/onehop/internal/vcmp"
)

// fakeHelper records what it was asked to do.
type fakeHelper struct {
	mu  sync.Mutex
	log []string
	on  map[vcmp.Tuple]bool
}

func (f *fakeHelper) Name() string { return "fake" }

func (f *fakeHelper) Start(v vcmp.Tuple) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.on == nil {
		f.on = map[vcmp.Tuple]bool{}
	}
	f.on[v] = true
	f.log = append(f.log, "start "+v.String())
	return nil
}

func (f *fakeHelper) Stop(v vcmp.Tuple) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.on, v)
	f.log = append(f.log, "stop "+v.String())
	return nil
}

func (f *fakeHelper) running() []vcmp.Tuple {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []vcmp.Tuple
	for v := range f.on {
		out = append(out, v)
	}
	return out
}

// The stationary end's helpers start when its peer claims the primary
// role (the peer is about to leave) and stop when the peer's update
// settles the connection; the mover runs none.
func TestHelpersRunOnTheStationaryEndWhileItsPeerIsAway(t *testing.T) {
	n := newNetwork()
	ha, hb := &fakeHelper{}, &fakeHelper{}
	a := n.add(t, "a", "10.0.1.1", Config{Helpers: []Helper{ha}})
	b := n.add(t, "b", "10.0.2.2", Config{Helpers: []Helper{hb}})
	ta, tb := connect(a, b, 40000)
	_, tb2 := connect(a, b, 40001)
	syncAll(t, a, b)
	if got := hb.running(); len(got) != 0 {
		t.Fatalf("helpers running before any suspend: %v", got)
	}
	if _, err := a.e.Suspend(t.Context(), func(v vcmp.Tuple) bool { return v == ta }); err != nil {
		t.Fatal(err)
	}
	if got := hb.running(); !slices.Equal(got, []vcmp.Tuple{tb}) {
		t.Fatalf("b's helpers after a suspended one connection: %v, want [%v]", got, tb)
	}
	if !state(t, b, tb).Helper || state(t, b, tb2).Helper {
		t.Errorf("status helper flags: %+v %+v; want only the suspended one", state(t, b, tb), state(t, b, tb2))
	}
	if got := ha.running(); len(got) != 0 {
		t.Errorf("the mover runs helpers: %v", got)
	}
	old, new := n.move(a, "10.0.3.3")
	if err := a.e.Restore(t.Context(), old, new); err != nil {
		t.Fatal(err)
	}
	wantPhys(t, b, tb, b.addr, new)
	if got := hb.running(); len(got) != 0 {
		t.Fatalf("b's helpers after a's update: %v, want none", got)
	}
	want := []string{"start " + tb.String(), "stop " + tb.String()}
	if !slices.Equal(hb.log, want) {
		t.Errorf("b's helper log %v, want %v", hb.log, want)
	}
	if c := b.e.Counters(); c["helpers_started"] != 1 || c["helpers_stopped"] != 1 {
		t.Errorf("b counters %v, want one helper start and one stop", c)
	}
}

// A connection whose peer never comes back stops its helpers when it
// closes, and the daemon's stop stops every helper still running.
func TestHelpersStopWhenTheConnectionClosesOrTheDaemonStops(t *testing.T) {
	n := newNetwork()
	hb := &fakeHelper{}
	a := n.add(t, "a", "10.0.1.1", Config{})
	b := n.add(t, "b", "10.0.2.2", Config{Helpers: []Helper{hb}})
	_, tb := connect(a, b, 40000)
	_, tb2 := connect(a, b, 40001)
	syncAll(t, a, b)
	if k, err := a.e.Suspend(t.Context(), nil); err != nil || k != 2 {
		t.Fatalf("suspend: %d, %v", k, err)
	}
	if got := hb.running(); len(got) != 2 {
		t.Fatalf("b's helpers: %v, want both connections", got)
	}
	b.tr.close(tb)
	syncAll(t, b)
	if got := hb.running(); !slices.Equal(got, []vcmp.Tuple{tb2}) {
		t.Fatalf("b's helpers after %v closed: %v, want [%v]", tb, got, tb2)
	}
	b.e.StopHelpers()
	if got := hb.running(); len(got) != 0 {
		t.Fatalf("b's helpers after the daemon stopped them: %v", got)
	}
}

// The freezer freezes once for the first connection whose peer is away
// and thaws once when the last one is back.
func TestFreezerFreezesForTheFirstAndThawsAfterTheLast(t *testing.T) {
	var calls []bool
	f := &Freezer{Set: func(frozen bool) error { calls = append(calls, frozen); return nil }}
	c1 := vcmp.Tuple{Proto: vcmp.TCP, Local: ap("10.0.2.2:22"), Remote: ap("10.0.1.1:40000")}
	c2 := vcmp.Tuple{Proto: vcmp.TCP, Local: ap("10.0.2.2:22"), Remote: ap("10.0.1.1:40001")}
	steps := []struct {
		start bool
		c     vcmp.Tuple
		want  []bool
	}{
		{true, c1, []bool{true}},
		{true, c2, []bool{true}},
		{true, c1, []bool{true}}, // again: nothing
		{false, c1, []bool{true}},
		{false, c1, []bool{true}}, // not away: nothing
		{false, c2, []bool{true, false}},
		{true, c2, []bool{true, false, true}},
	}
	for i, s := range steps {
		var err error
		if s.start {
			err = f.Start(s.c)
		} else {
			err = f.Stop(s.c)
		}
		if err != nil || !slices.Equal(calls, s.want) {
			t.Fatalf("step %d (start=%v %v): calls %v, %v; want %v", i, s.start, s.c, calls, err, s.want)
		}
	}
	failing := &Freezer{Set: func(bool) error { return fmt.Errorf("no cgroup") }}
	if err := failing.Start(c1); err == nil {
		t.Fatal("a freeze that failed returned no error")
	}
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
