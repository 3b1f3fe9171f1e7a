package sdnotify

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// listen opens a unixgram socket at name (a path, or "@..." abstract) and
// points $NOTIFY_SOCKET at it for the test.
func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	addr := name
	if name[0] == '@' {
		addr = "\x00" + name[1:]
	}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	t.Setenv("NOTIFY_SOCKET", name)
	return c
}

// receive returns the next datagram, or "" when none comes within wait.
func receive(t *testing.T, c *net.UnixConn, wait time.Duration) string {
	t.Helper()
	buf := make([]byte, 4096)
	c.SetReadDeadline(time.Now().Add(wait))
	n, err := c.Read(buf)
	if err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return ""
		}
		t.Fatal(err)
	}
	return string(buf[:n])
}

func TestNotifySendsItsStatesInOneDatagram(t *testing.T) {
	c := listen(t, filepath.Join(t.TempDir(), "notify"))
	if err := Notify(Ready, Status("serving\non :8443")); err != nil {
		t.Fatal(err)
	}
	if got, want := receive(t, c, 5*time.Second), "READY=1\nSTATUS=serving on :8443\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if err := Notify(Stopping); err != nil {
		t.Fatal(err)
	}
	if got := receive(t, c, 5*time.Second); got != "STOPPING=1\n" {
		t.Fatalf("got %q, want STOPPING=1", got)
	}
}

func TestNotifyReachesAnAbstractSocket(t *testing.T) {
	c := listen(t, fmt.Sprintf("@onehop-sdnotify-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err := Notify(Ready); err != nil {
		t.Fatal(err)
	}
	if got := receive(t, c, 5*time.Second); got != "READY=1\n" {
		t.Fatalf("got %q, want READY=1", got)
	}
}

// Without $NOTIFY_SOCKET nothing is sent, and that is no error: the
// socket set up beside the test, still listening, hears nothing.
func TestNotifyWithoutNotifySocketSendsNothing(t *testing.T) {
	c := listen(t, filepath.Join(t.TempDir(), "notify"))
	t.Setenv("NOTIFY_SOCKET", "")
	if err := Notify(Ready); err != nil {
		t.Fatalf("unset NOTIFY_SOCKET: %v, want nil", err)
	}
	if got := receive(t, c, 200*time.Millisecond); got != "" {
		t.Fatalf("received %q with NOTIFY_SOCKET unset", got)
	}
	t.Setenv("NOTIFY_SOCKET", "relative/path")
	if err := Notify(Ready); err == nil {
		t.Fatal("a relative NOTIFY_SOCKET: no error")
	}
}
