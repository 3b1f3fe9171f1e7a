package testenv

import (
	"errors"
	"testing"
	"time"
)

// Check is what Eventually waits on: a func() error that returns nil once
// the awaited thing holds (and otherwise says what it saw instead), or a
// func() bool that reports whether it holds.
type Check interface{ func() error | func() bool }

// The pause between checks starts short, so that what settles in
// microseconds (an in-memory watch, an in-process reconcile) is seen at
// once, and doubles up to a ceiling, so that a check that runs a command or
// scrapes a daemon does not crowd the machine the system under test runs
// on. The schedule is fixed: no caller tunes it.
const (
	firstPause = 100 * time.Microsecond
	maxPause   = 100 * time.Millisecond
)

// errNotYet is a func() bool check's "false": it has nothing more to say.
var errNotYet = errors.New("not yet")

// Eventually runs check until it holds: at once, then after pauses that
// double from 0.1 ms up to 100 ms (about ten checks in the first 100 ms,
// then ten a second; the last pause is cut short at the deadline). When
// timeout has passed and it still does not hold, it fails t (FailNow)
// saying what was awaited and the last error check returned. Call it from
// the test's goroutine, as t.FailNow must be; check may fail t itself when
// what it sees can never turn out well.
func Eventually[C Check](t testing.TB, what string, timeout time.Duration, check C) {
	t.Helper()
	var f func() error
	switch c := any(check).(type) {
	case func() error:
		f = c
	case func() bool:
		f = func() error {
			if c() {
				return nil
			}
			return errNotYet
		}
	}
	deadline := time.Now().Add(timeout)
	pause := firstPause
	for {
		err := f()
		if err == nil {
			return
		}
		left := time.Until(deadline)
		if left <= 0 {
			if err == errNotYet {
				t.Fatalf("timed out after %v waiting for %s", timeout, what)
			}
			t.Fatalf("timed out after %v waiting for %s: %v", timeout, what, err)
			return // a fake t's Fatalf may return
		}
		// The last check falls on the deadline, not a pause after it.
		time.Sleep(min(pause, left))
		pause = min(2*pause, maxPause)
	}
}
