package testenv

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fakeT records how Eventually fails a test. Its Fatalf ends the calling
// goroutine, as testing.T's FailNow does, so Eventually runs in one of its
// own (run).
type fakeT struct {
	testing.TB
	failure string
}

func (f *fakeT) Helper() {}

func (f *fakeT) Fatalf(format string, args ...any) {
	f.failure = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls Eventually against a fake test and returns how it failed the
// test ("" when it returned).
func run[C Check](what string, timeout time.Duration, check C) string {
	f := &fakeT{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Eventually(f, what, timeout, check)
	}()
	<-done
	return f.failure
}

func TestEventuallyReturnsOnceTheCheckHolds(t *testing.T) {
	calls := 0
	fail := run("the third call", time.Minute, func() error {
		calls++
		if calls < 3 {
			return fmt.Errorf("call %d", calls)
		}
		return nil
	})
	if fail != "" || calls != 3 {
		t.Fatalf("failed %q after %d calls; want a return after the third", fail, calls)
	}
	calls = 0
	fail = run("a bool", time.Minute, func() bool { calls++; return calls == 2 })
	if fail != "" || calls != 2 {
		t.Fatalf("bool check: failed %q after %d calls; want a return after the second", fail, calls)
	}
}

func TestEventuallyFailsWithWhatItAwaitedAndTheLastError(t *testing.T) {
	calls := 0
	fail := run("the pool to drain", 0, func() error {
		calls++
		return errors.New("3 left")
	})
	if calls != 1 {
		t.Errorf("%d calls with no time to wait; want one", calls)
	}
	for _, want := range []string{"the pool to drain", "3 left"} {
		if !strings.Contains(fail, want) {
			t.Errorf("failure %q does not say %q", fail, want)
		}
	}
	fail = run("a flag", 0, func() bool { return false })
	if !strings.Contains(fail, "a flag") || strings.Contains(fail, errNotYet.Error()) {
		t.Errorf("bool check's failure %q: want what was awaited and nothing about an error", fail)
	}
}

// The check may end the test itself, for what no wait can mend.
func TestEventuallyLetsTheCheckFailTheTest(t *testing.T) {
	f := &fakeT{}
	done := make(chan struct{})
	calls := 0
	go func() {
		defer close(done)
		Eventually(f, "never", time.Minute, func() error {
			calls++
			f.Fatalf("broken for good")
			return nil
		})
	}()
	<-done
	if f.failure != "broken for good" || calls != 1 {
		t.Fatalf("failure %q after %d calls; want the check's own, at once", f.failure, calls)
	}
}
