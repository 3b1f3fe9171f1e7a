package sdnotify

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/sdnotify/sdnotifytest"
)

func TestNotifySendsItsStatesInOneDatagram(t *testing.T) {
	c := sdnotifytest.Listen(t)
	if err := Notify(Ready, Status("serving\non :8443")); err != nil {
		t.Fatal(err)
	}
	if got, want := c.Receive(5*time.Second), "READY=1\nSTATUS=serving on :8443\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if err := Notify(Stopping); err != nil {
		t.Fatal(err)
	}
	if got := c.Receive(5 * time.Second); got != "STOPPING=1\n" {
		t.Fatalf("got %q, want STOPPING=1", got)
	}
}

func TestNotifyReachesAnAbstractSocket(t *testing.T) {
	c := sdnotifytest.Listen(t, fmt.Sprintf("onehop-sdnotify-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err := Notify(Ready); err != nil {
		t.Fatal(err)
	}
	if got := c.Receive(5 * time.Second); got != "READY=1\n" {
		t.Fatalf("got %q, want READY=1", got)
	}
}

// Without $NOTIFY_SOCKET nothing is sent, and that is no error: the
// socket set up beside the test, still listening, hears nothing.
func TestNotifyWithoutNotifySocketSendsNothing(t *testing.T) {
	c := sdnotifytest.Listen(t)
	t.Setenv("NOTIFY_SOCKET", "")
	if err := Notify(Ready); err != nil {
		t.Fatalf("unset NOTIFY_SOCKET: %v, want nil", err)
	}
	if got := c.Receive(200 * time.Millisecond); got != "" {
		t.Fatalf("received %q with NOTIFY_SOCKET unset", got)
	}
	t.Setenv("NOTIFY_SOCKET", "relative/path")
	if err := Notify(Ready); err == nil {
		t.Fatal("a relative NOTIFY_SOCKET: no error")
	}
}
