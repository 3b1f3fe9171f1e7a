// Package netnstest builds what namespace tests share: network namespaces
// and veth pairs that go when the test ends, a bpffs of the test's own,
// daemons (the real `onehop` binary) running in a namespace with their
// output kept for the failure message, and servers. Everything is undone by t.Cleanup, so
// it is undone when a test fails half-way too.
package netnstest

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/testenv"
)

// New creates a network namespace named prefix-XXXXXX (six random hex
// digits: runs of the same test, and tests of several packages running at
// once, do not collide) and deletes it when t ends.
func New(t testing.TB, prefix string) string {
	t.Helper()
	sfx := make([]byte, 3)
	if _, err := rand.Read(sfx); err != nil {
		t.Fatal(err)
	}
	name := prefix + "-" + hex.EncodeToString(sfx)
	if err := netns.Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netns.Delete(name); err != nil {
			t.Error(err)
		}
	})
	return name
}

// Veth joins namespaces nsA and nsB (they may be one) with a veth pair, a
// in nsA and b in nsB, both up. It goes with the namespaces.
func Veth(t testing.TB, a, nsA, b, nsB string) {
	t.Helper()
	ha, err := netns.Handle(nsA)
	if err != nil {
		t.Fatal(err)
	}
	defer ha.Close()
	fdB, err := netns.Fd(nsB)
	if err != nil {
		t.Fatal(err)
	}
	defer fdB.Close()
	v := netlink.NewVeth(netlink.NewLinkAttrs())
	v.Name, v.PeerName, v.PeerNamespace = a, b, netlink.NsFd(int(fdB))
	if err := ha.LinkAdd(v); err != nil {
		t.Fatalf("veth %s in %s, %s in %s: %v", a, nsA, b, nsB, err)
	}
	hb, err := netns.Handle(nsB)
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Close()
	for _, end := range []struct {
		h    *netlink.Handle
		name string
	}{{ha, a}, {hb, b}} {
		l, err := end.h.LinkByName(end.name)
		if err == nil {
			err = end.h.LinkSetUp(l)
		}
		if err != nil {
			t.Fatalf("bring %s up: %v", end.name, err)
		}
	}
}

// IP runs `ip -n ns ARGS...` and fails t with its output if it fails.
func IP(t testing.TB, ns string, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip -n %s %s: %v: %s", ns, strings.Join(args, " "), err, out)
	}
}

// SNMP reads one counter of /proc/net/snmp in namespace ns (Tcp
// InCsumErrors, say), failing t if it cannot.
func SNMP(t testing.TB, ns, proto, field string) uint64 {
	t.Helper()
	v, err := netns.SNMP(ns, proto, field)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Netstat reads one counter of /proc/net/netstat in namespace ns (TcpExt
// OutOfWindowIcmps, say), failing t if it cannot.
func Netstat(t testing.TB, ns, proto, field string) uint64 {
	t.Helper()
	v, err := netns.Netstat(ns, proto, field)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// BPFFS mounts a bpffs of t's own and returns where; it is unmounted when
// t ends. A daemon started through `onehop netns-exec` sees a /sys of its
// namespace, so pins it must keep across a restart live here, not under
// /sys/fs/bpf.
func BPFFS(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, ""); err != nil {
		t.Fatalf("mount bpffs at %s: %v", dir, err)
	}
	// Registered after TempDir's removal, so it runs before it.
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Error(err)
		}
	})
	return dir
}

// Onehop builds cmd/onehop into t's temporary directory and returns its
// path: the daemons a test starts are the real binary, as the lab runs them.
func Onehop(t testing.TB) string {
	t.Helper()
	testenv.RequireTool(t, "go")
	bin := filepath.Join(t.TempDir(), "onehop")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/onehop/onehop/cmd/onehop").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	return bin
}

// Daemon is a process a test started and that runs until the test stops it
// or ends.
type Daemon struct {
	Name string // what the test's messages call it
	Cmd  *exec.Cmd
	Log  *testenv.Buffer // its stdout and stderr
	done chan struct{}
	err  error // how it exited, once done is closed
}

// Start starts cmd with its output appended to log (a daemon the test
// restarts keeps one log) and kills it when t ends, unless it exited
// before; name is what failure messages call it. Wrap a command in `onehop
// netns-exec NS --` to run it in a namespace.
func Start(t testing.TB, name string, log *testenv.Buffer, cmd *exec.Cmd) *Daemon {
	t.Helper()
	d := &Daemon{Name: name, Cmd: cmd, Log: log, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = d.Log, d.Log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		d.err = cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		select {
		case <-d.done:
			return
		default:
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Error(err)
		}
		<-d.done
	})
	return d
}

// Done is closed once the process has exited.
func (d *Daemon) Done() <-chan struct{} { return d.done }

// Ready waits up to timeout for ready to return nil (a daemon answering on
// its control socket), failing t with the daemon's log if it does not, or
// at once if the daemon exits first.
func (d *Daemon) Ready(t testing.TB, timeout time.Duration, ready func() error) {
	t.Helper()
	testenv.Eventually(t, d.Name+" to answer", timeout, func() error {
		select {
		case <-d.done:
			t.Fatalf("%s exited at start: %v\n%s", d.Name, d.err, d.Log)
		default:
		}
		return testenv.WithLogs(ready(), d.Log)
	})
}

// Wait waits up to timeout for the process to exit and returns how it
// exited (nil for status 0); it fails t if the process is still running.
func (d *Daemon) Wait(t testing.TB, timeout time.Duration) error {
	t.Helper()
	select {
	case <-d.done:
		return d.err
	case <-time.After(timeout):
		t.Fatalf("%s did not exit in %v:\n%s", d.Name, timeout, d.Log)
		return nil
	}
}

// Listen listens on TCP addr in namespace ns until t ends.
func Listen(t testing.TB, ns, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := netns.Do(ns, func() (err error) {
		ln, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// Dial connects to TCP addr from namespace ns (from local, when not nil)
// and closes the connection when t ends.
func Dial(t testing.TB, ns string, local *net.TCPAddr, addr string, timeout time.Duration) net.Conn {
	t.Helper()
	var c net.Conn
	if err := netns.Do(ns, func() (err error) {
		d := net.Dialer{Timeout: timeout}
		if local != nil {
			d.LocalAddr = local
		}
		c, err = d.Dial("tcp4", addr)
		return err
	}); err != nil {
		t.Fatalf("dial %s from %s in %s: %v", addr, local, ns, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Serve accepts connections on ln until it is closed and runs handle on
// each in a goroutine of its own, closing the connection after: the
// server a test runs in a namespace.
func Serve(ln net.Listener, handle func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			handle(c)
		}()
	}
}
