package backoff

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"
)

const ms = time.Millisecond

// call is one failed try: at is when it failed (since the first try),
// pause and ok what Next must answer.
type call struct {
	at    time.Duration
	pause time.Duration
	ok    bool
}

// The pauses a schedule returns, and when it gives up, for each way a loop
// sets it: the clock is the test's, so nothing here waits.
func TestNextReturnsTheScheduleAndGivesUp(t *testing.T) {
	for _, tc := range []struct {
		name  string
		b     Backoff
		calls []call
	}{
		{"zero value: at once, for ever", Backoff{},
			[]call{{0, 0, true}, {0, 0, true}, {time.Hour, 0, true}}},
		{"doubling without a cap", Backoff{Initial: 250 * ms},
			[]call{{0, 250 * ms, true}, {0, 500 * ms, true}, {0, time.Second, true}, {0, 2 * time.Second, true}}},
		{"doubling up to Max", Backoff{Initial: 100 * ms, Max: 300 * ms},
			[]call{{0, 100 * ms, true}, {0, 200 * ms, true}, {0, 300 * ms, true}, {0, 300 * ms, true}}},
		{"Max equal to Initial: constant", Backoff{Initial: 5 * time.Second, Max: 5 * time.Second},
			[]call{{0, 5 * time.Second, true}, {10 * time.Second, 5 * time.Second, true}, {time.Hour, 5 * time.Second, true}}},
		{"Initial above Max: capped from the first pause", Backoff{Initial: time.Second, Max: 100 * ms},
			[]call{{0, 100 * ms, true}, {0, 100 * ms, true}}},
		{"Tries counts the first try", Backoff{Initial: 250 * ms, Tries: 4},
			[]call{{0, 250 * ms, true}, {0, 500 * ms, true}, {0, time.Second, true}, {0, 0, false}, {0, 0, false}}},
		{"one try: no retry", Backoff{Initial: time.Second, Tries: 1},
			[]call{{0, 0, false}}},
		{"For: a pause that would end after it is not taken", Backoff{Initial: 100 * ms, For: time.Second},
			[]call{{500 * ms, 100 * ms, true}, {950 * ms, 0, false}}},
		{"For: a pause that ends just then is taken", Backoff{Initial: 100 * ms, For: time.Second},
			[]call{{900 * ms, 100 * ms, true}}},
		{"For and Tries: the first spent wins", Backoff{Initial: 100 * ms, Tries: 3, For: time.Hour},
			[]call{{0, 100 * ms, true}, {0, 200 * ms, true}, {0, 0, false}}},
		{"a pause that would overflow stays", Backoff{Initial: math.MaxInt64/2 + 1},
			[]call{{0, math.MaxInt64/2 + 1, true}, {0, math.MaxInt64/2 + 1, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Unix(1000, 0)
			r := tc.b.Start(start)
			for i, c := range tc.calls {
				pause, ok := r.Next(start.Add(c.at))
				if pause != c.pause || ok != c.ok {
					t.Errorf("call %d (at %v): Next = %v, %v; want %v, %v", i+1, c.at, pause, ok, c.pause, c.ok)
				}
			}
		})
	}
}

// A loop that takes no time between tries (the clock moves by the pauses
// alone) retries for For and not a pause longer.
func TestForBoundsTheSumOfThePauses(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    Backoff
		want []time.Duration
	}{
		{"100 ms doubling to 2 s, for 15 s", Backoff{Initial: 100 * ms, Max: 2 * time.Second, For: 15 * time.Second},
			[]time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 2 * time.Second, 2 * time.Second, 2 * time.Second, 2 * time.Second, 2 * time.Second}},
		{"for less than the first pause: no retry", Backoff{Initial: 100 * ms, For: ms}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			r := tc.b.Start(now)
			var got []time.Duration
			for len(got) < 100 {
				pause, ok := r.Next(now)
				if !ok {
					break
				}
				got = append(got, pause)
				now = now.Add(pause)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("pauses %v, want %v", got, tc.want)
			}
		})
	}
}

// Stop spends a schedule that had tries left.
func TestStopEndsTheSchedule(t *testing.T) {
	now := time.Unix(1000, 0)
	r := Backoff{Initial: ms}.Start(now)
	if _, ok := r.Next(now); !ok {
		t.Fatal("an unbounded schedule gave up")
	}
	r.Stop()
	if pause, ok := r.Next(now); ok {
		t.Errorf("after Stop: Next = %v, true; want false", pause)
	}
}

// Or fills only the fields a caller left zero.
func TestOrTakesZeroFieldsFromTheDefaults(t *testing.T) {
	d := Backoff{Initial: 100 * ms, Max: 2 * time.Second, Tries: 4, For: 15 * time.Second}
	for _, tc := range []struct {
		name string
		b    Backoff
		want Backoff
	}{
		{"zero: the defaults", Backoff{}, d},
		{"one field set", Backoff{For: ms}, Backoff{Initial: 100 * ms, Max: 2 * time.Second, Tries: 4, For: ms}},
		{"all set: unchanged", Backoff{Initial: 1, Max: 2, Tries: 3, For: 4}, Backoff{Initial: 1, Max: 2, Tries: 3, For: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.b.Or(d); got != tc.want {
				t.Errorf("%+v.Or(%+v) = %+v, want %+v", tc.b, d, got, tc.want)
			}
		})
	}
}

// Sleep says whether it slept or the context ended.
func TestSleepSaysWhetherTheContextEnded(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		d    time.Duration
		want bool
	}{
		{"nothing to wait for", context.Background(), 0, true},
		{"context ended", ended, time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Sleep(tc.ctx, tc.d); got != tc.want {
				t.Errorf("Sleep(%v) = %v, want %v", tc.d, got, tc.want)
			}
		})
	}
}
