package netnstest

import (
	"io"
	"net"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/testenv"
)

// What a test builds is there while it runs, the veths' ends up in their
// namespaces, and all of it is gone when the test ends (t.Cleanup, which
// runs for a failed test too): the namespaces, the bpffs, the daemon.
func TestPrivilegedFixturesAreUpWhileTheTestRunsAndGoneAfter(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces and a bpffs")
	testenv.RequireTool(t, "ip", "sleep")
	var a, b, fs string
	var d *Daemon
	t.Run("fixtures", func(t *testing.T) {
		a, b = New(t, "nstest-a"), New(t, "nstest-b")
		Veth(t, "x0", a, "y0", b)
		Veth(t, "z0", a, "z1", a)
		IP(t, a, "addr", "add", "10.9.9.1/24", "dev", "x0")
		for _, end := range [][2]string{{a, "x0"}, {b, "y0"}, {a, "z0"}, {a, "z1"}} {
			h, err := netns.Handle(end[0])
			if err != nil {
				t.Fatal(err)
			}
			l, err := h.LinkByName(end[1])
			h.Close()
			if err != nil {
				t.Fatalf("%s in %s: %v", end[1], end[0], err)
			}
			if l.Attrs().RawFlags&unix.IFF_UP == 0 {
				t.Errorf("%s in %s is down", end[1], end[0])
			}
		}
		fs = BPFFS(t)
		var st unix.Statfs_t
		if err := unix.Statfs(fs, &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
			t.Errorf("%s: statfs %v, type %x; want a bpffs", fs, err, st.Type)
		}
		d = Start(t, "sleep", &testenv.Buffer{}, exec.Command("sleep", "60"))
		d.Ready(t, 5*time.Second, func() error { return nil })
	})
	for _, n := range []string{a, b} {
		if netns.Exists(n) {
			t.Errorf("namespace %s left after the test", n)
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(fs, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		t.Errorf("bpffs at %s left mounted", fs)
	}
	select {
	case <-d.Done():
	default:
		t.Error("the daemon runs on after the test")
	}
}

// Serve answers every connection, each closed after its handler, and
// returns once its listener is closed.
func TestServeHandlesEachConnectionUntilItsListenerCloses(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		Serve(ln, func(c net.Conn) { c.Write([]byte("hello")) }) //nolint:errcheck // the client reads it
	}()
	for range 2 {
		c, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c) // to EOF: Serve closed it
		c.Close()
		if err != nil || string(got) != "hello" {
			t.Fatalf("read %q, %v; want hello, then EOF", got, err)
		}
	}
	ln.Close()
	<-served
}
