package vnatd

import (
	"slices"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/backoff"
)

// The daemon's retry schedules keep the timing they had as literals and
// constants: the pauses each loop takes (the clock moving by the pauses
// alone) until it gives up, for the defaults and for a Config that sets one
// field of a schedule.
func TestRetrySchedulesKeepTheirPausesAndLimits(t *testing.T) {
	const ms = time.Millisecond
	walk := New(Config{}, nil, nil).cfg.WalkRetry
	claim := New(Config{}, nil, nil).cfg.ClaimRetry
	fastClaim := New(Config{ClaimRetry: backoff.Backoff{Initial: 20 * ms}}, nil, nil).cfg.ClaimRetry
	shortWalk := New(Config{WalkRetry: backoff.Backoff{For: time.Second}}, nil, nil).cfg.WalkRetry
	for _, tc := range []struct {
		name string
		b    backoff.Backoff
		want []time.Duration // every pause until the schedule is spent (at most 20)
	}{
		{"walk: 100 ms doubling to 2 s, for 15 s", walk,
			[]time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 2 * time.Second, 2 * time.Second, 2 * time.Second, 2 * time.Second, 2 * time.Second}},
		{"walk for 1 s: the same pauses, fewer", shortWalk,
			[]time.Duration{100 * ms, 200 * ms, 400 * ms}},
		{"claim: 250 ms doubling, SuspTries in all", claim,
			[]time.Duration{250 * ms, 500 * ms, time.Second}},
		{"claim from 20 ms: still SuspTries in all", fastClaim,
			[]time.Duration{20 * ms, 40 * ms, 80 * ms}},
		{"first-contact keys: MaxKeyTries, paced by the contact loop", keyRetry,
			[]time.Duration{0, 0, 0, 0}},
		{"unreachable location server: RetryUnreachable each time", serverRetry,
			slices.Repeat([]time.Duration{RetryUnreachable}, 20)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			r := tc.b.Start(now)
			var got []time.Duration
			for len(got) < 20 {
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
