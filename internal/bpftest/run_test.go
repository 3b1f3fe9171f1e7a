package bpftest_test

import (
	"fmt"
	"runtime"
	"slices"
	"testing"

	"github.com/onehop/onehop/internal/bpftest"
)

// recorder is a testing.TB whose failures are recorded, not reported: for
// checking that a helper fails when it must.
type recorder struct {
	testing.TB
	failed []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.failed = append(r.failed, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Fatal(args ...any) {
	r.failed = append(r.failed, fmt.Sprint(args...))
	runtime.Goexit()
}

// failures runs fn against a recorder, on a goroutine of its own (which a
// Fatal ends), and returns what it failed with.
func failures(t testing.TB, fn func(tb testing.TB)) []string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
	return r.failed
}

func TestCheckDeltaWantsEveryCounterToMoveByExactlyWhatTheRowSays(t *testing.T) {
	before := bpftest.Counters{"drop malformed": 5, "forward local": 1}
	after := bpftest.Counters{"drop malformed": 6, "forward local": 1, "drop new": 0}
	for _, c := range []struct {
		name string
		want bpftest.Counters
		fail []string
	}{
		{"the counter named rose by one, the rest stayed", bpftest.Counters{"drop malformed": 1}, nil},
		{"a counter rose that the row does not name", nil, []string{"counter drop malformed rose by 1, want 0"}},
		{"a counter stayed that the row says rises",
			bpftest.Counters{"drop malformed": 1, "forward local": 1}, []string{"counter forward local rose by 0, want 1"}},
		{"the row names a counter there is not",
			bpftest.Counters{"drop malformed": 1, "drop missing": 1}, []string{"no counter drop missing"}},
	} {
		got := failures(t, func(tb testing.TB) { bpftest.CheckDelta(tb, before, after, c.want) })
		if !slices.Equal(got, c.fail) {
			t.Errorf("%s: failed with %q, want %q", c.name, got, c.fail)
		}
	}
}

func TestCountersAddNamesEachCounterByItsPrefix(t *testing.T) {
	c := bpftest.Counters{}.Add("drop", map[string]uint64{"malformed": 2}).Add("s1", map[string]uint64{"in": 3})
	if len(c) != 2 || c["drop malformed"] != 2 || c["s1 in"] != 3 {
		t.Fatalf("got %v", c)
	}
}
