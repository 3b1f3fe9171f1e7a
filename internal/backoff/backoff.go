// Package backoff is the one shape of a retry loop: the pause before each
// try again, doubling up to a cap, and when to give up (after so many
// tries, or so long after the first). It is pure and brings no clock of its
// own: the caller says what time it is, so a schedule is tested by the
// pauses it returns, and a daemon's injected clock drives it in its tests.
package backoff

import (
	"context"
	"time"
)

// Backoff is a retry schedule. Its zero value retries at once and for
// ever; a loop's defaults are a Backoff too (see Or).
type Backoff struct {
	// Initial is the pause before the first retry; each later pause is
	// twice the one before.
	Initial time.Duration
	// Max caps a pause; 0 is no cap. Max equal to Initial is a constant
	// pause.
	Max time.Duration
	// Tries is how many tries there are in all, the first included; 0 is
	// no limit.
	Tries int
	// For is how long after the first try a retry may still start: a
	// pause that would end later is not taken. 0 is no limit.
	For time.Duration
}

// Or is b with each zero field taken from d, so a caller that sets one
// field of a setting keeps the defaults of the others.
func (b Backoff) Or(d Backoff) Backoff {
	if b.Initial == 0 {
		b.Initial = d.Initial
	}
	if b.Max == 0 {
		b.Max = d.Max
	}
	if b.Tries == 0 {
		b.Tries = d.Tries
	}
	if b.For == 0 {
		b.For = d.For
	}
	return b
}

// Start begins a loop on the schedule whose first try is at now.
func (b Backoff) Start(now time.Time) *Retry {
	return &Retry{b: b, pause: b.Initial, giveUp: now.Add(b.For)}
}

// Retry is one loop's way along its schedule.
type Retry struct {
	b      Backoff
	failed int           // tries that failed so far
	pause  time.Duration // the pause Next returns next
	giveUp time.Time     // no retry starts after it (when b.For is set)
	done   bool          // Stop was called
}

// Next is called when a try failed at now: it returns the pause before the
// next try, or false when the schedule is spent and the loop gives up.
func (r *Retry) Next(now time.Time) (time.Duration, bool) {
	r.failed++
	if r.done || (r.b.Tries > 0 && r.failed >= r.b.Tries) {
		return 0, false
	}
	p := r.pause
	if r.b.Max > 0 {
		p = min(p, r.b.Max)
	}
	if r.b.For > 0 && now.Add(p).After(r.giveUp) {
		return 0, false
	}
	r.pause = p
	if next := 2 * p; next > p { // doubling, unless it would overflow
		r.pause = next
	}
	return p, true
}

// Stop spends the schedule: Next returns false from now on (an error that
// retrying will not mend).
func (r *Retry) Stop() { r.done = true }

// Sleep pauses for d or until ctx ends, whichever comes first; it returns
// false when ctx ended.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
