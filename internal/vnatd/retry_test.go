package vnatd

import (
	"testing"
	"time"

	"github.com/onehop/onehop/internal/backoff"
)

// The daemon's retry schedules keep the timing they had as literals and
// constants (the pauses each one gives are internal/backoff's tests), and
// a Config that sets one field of a schedule keeps the others' defaults.
func TestRetrySchedulesKeepTheirDefaults(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name      string
		got, want backoff.Backoff
	}{
		{"walk: 100 ms doubling to 2 s, for 15 s", New(Config{}, nil, nil).cfg.WalkRetry,
			backoff.Backoff{Initial: 100 * ms, Max: 2 * time.Second, For: 15 * time.Second}},
		{"walk for 1 s", New(Config{WalkRetry: backoff.Backoff{For: time.Second}}, nil, nil).cfg.WalkRetry,
			backoff.Backoff{Initial: 100 * ms, Max: 2 * time.Second, For: time.Second}},
		{"claim: 250 ms doubling, 4 tries", New(Config{}, nil, nil).cfg.ClaimRetry,
			backoff.Backoff{Initial: 250 * ms, Tries: 4}},
		{"claim from 20 ms: still 4 tries", New(Config{ClaimRetry: backoff.Backoff{Initial: 20 * ms}}, nil, nil).cfg.ClaimRetry,
			backoff.Backoff{Initial: 20 * ms, Tries: 4}},
		{"first-contact keys: 5 tries, paced by the contact loop", keyRetry,
			backoff.Backoff{Tries: 5}},
		{"unreachable location server: 5 s each time", serverRetry,
			backoff.Backoff{Initial: 5 * time.Second, Max: 5 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("schedule %+v, want %+v", tc.got, tc.want)
			}
		})
	}
}
