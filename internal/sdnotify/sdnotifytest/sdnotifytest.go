// Package sdnotifytest plays systemd's side of sd_notify in tests: a
// datagram socket that $NOTIFY_SOCKET points at, and a way to read what a
// daemon told it.
package sdnotifytest

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Socket is the listening end of $NOTIFY_SOCKET.
type Socket struct {
	t *testing.T
	c *net.UnixConn
}

// Listen opens a unixgram socket (a file in a temporary directory, or the
// abstract name given as "@name") and sets $NOTIFY_SOCKET to it for the
// rest of the test; the socket closes when the test ends.
func Listen(t *testing.T, abstract ...string) *Socket {
	t.Helper()
	name := filepath.Join(t.TempDir(), "notify")
	addr := name
	if len(abstract) > 0 {
		name, addr = "@"+abstract[0], "\x00"+abstract[0]
	}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	t.Setenv("NOTIFY_SOCKET", name)
	return &Socket{t: t, c: c}
}

// Receive returns the next datagram, or "" when none comes within wait.
func (s *Socket) Receive(wait time.Duration) string {
	s.t.Helper()
	buf := make([]byte, 4096)
	s.c.SetReadDeadline(time.Now().Add(wait))
	n, err := s.c.Read(buf)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return ""
	}
	if err != nil {
		s.t.Fatal(err)
	}
	return string(buf[:n])
}
