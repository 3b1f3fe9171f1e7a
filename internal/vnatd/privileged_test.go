package vnatd

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/testenv"
)

// syncBuf is a daemon's log, written by its process and read by the test.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func ipIn(t *testing.T, ns string, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip -n %s %s: %v: %s", ns, strings.Join(args, " "), err, out)
	}
}

// waitStatus asks the daemon behind sock until cond holds for the
// connection named by virtual, or fails after timeout with the logs.
func waitStatus(t *testing.T, sock, virtual string, timeout time.Duration, cond func(ConnStatus) bool, logs ...*syncBuf) ConnStatus {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last Reply
	var lastErr error
	for time.Now().Before(deadline) {
		last, lastErr = Ask(sock, Request{Op: "status"})
		if lastErr == nil {
			for _, c := range last.Conns {
				if c.Virtual == virtual && cond(c) {
					return c
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	var l []string
	for _, b := range logs {
		l = append(l, b.String())
	}
	t.Fatalf("%s: connection %s never reached the state wanted; last status %+v, %v\nlogs:\n%s", sock, virtual, last, lastErr, strings.Join(l, "\n---\n"))
	return ConnStatus{}
}

// Two namespaces on a veth, `onehop vnat run` in each (the real binary, as
// the lab starts it), a TCP connection and a connected UDP pair between them; one end is
// re-addressed to another subnet with `ip addr` and nothing else (no
// suspend; the daemons keyed the connection at first contact and refuse
// unkeyed updates): its
// daemon notices, finds the peer's daemon, and both install the
// translation; the connection carries on. Then the other end moves too.
// pairOfDaemons makes two namespaces joined by a veth (a0 10.8.0.1/24,
// b0 10.8.0.2/24) and runs the real `onehop vnat run --require-keys` in
// each; it returns their names, control sockets and logs.
func pairOfDaemons(t *testing.T) (nsA, nsB, sockA, sockB string, logA, logB *syncBuf) {
	t.Helper()
	return pairOfDaemonsArgs(t, nil, nil)
}

// pairOfDaemonsArgs is pairOfDaemons with more `vnat run` flags for a and b.
func pairOfDaemonsArgs(t *testing.T, argsA, argsB []string) (nsA, nsB, sockA, sockB string, logA, logB *syncBuf) {
	t.Helper()
	p := newPair(t, argsA, argsB)
	return p.nsA, p.nsB, p.a.sock, p.b.sock, p.a.logs, p.b.logs
}

// pair is two namespaces on a veth with a daemon in each.
type pair struct {
	nsA, nsB string
	bin, dir string
	a, b     *daemonProc
}

// daemonProc is one `onehop vnat run`.
type daemonProc struct {
	ns, iface string
	args      []string
	sock      string
	logs      *syncBuf
	cmd       *exec.Cmd
	done      chan struct{} // closed when it exited
}

func newPair(t *testing.T, argsA, argsB []string) *pair {
	t.Helper()
	testenv.RequireRoot(t, "network namespaces and BPF")
	testenv.RequireTool(t, "ip", "go")
	suffix := make([]byte, 3)
	if _, err := rand.Read(suffix); err != nil {
		t.Fatal(err)
	}
	p := &pair{nsA: "vnatd-a-" + hex.EncodeToString(suffix), nsB: "vnatd-b-" + hex.EncodeToString(suffix)}
	for _, n := range []string{p.nsA, p.nsB} {
		if err := netns.Create(n); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := netns.Delete(n); err != nil {
				t.Error(err)
			}
		})
	}
	out, err := exec.Command("ip", "link", "add", "a0", "netns", p.nsA, "type", "veth", "peer", "name", "b0", "netns", p.nsB).CombinedOutput()
	if err != nil {
		t.Fatalf("veth: %v: %s", err, out)
	}
	ipIn(t, p.nsA, "addr", "add", "10.8.0.1/24", "dev", "a0")
	ipIn(t, p.nsB, "addr", "add", "10.8.0.2/24", "dev", "b0")
	ipIn(t, p.nsA, "link", "set", "a0", "up")
	ipIn(t, p.nsB, "link", "set", "b0", "up")

	p.dir = t.TempDir()
	p.bin = filepath.Join(p.dir, "onehop")
	if out, err := exec.Command("go", "build", "-o", p.bin, "../../cmd/onehop").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	p.a = &daemonProc{ns: p.nsA, iface: "a0", args: argsA, sock: filepath.Join(p.dir, p.nsA+".sock"), logs: &syncBuf{}}
	p.b = &daemonProc{ns: p.nsB, iface: "b0", args: argsB, sock: filepath.Join(p.dir, p.nsB+".sock"), logs: &syncBuf{}}
	p.start(t, p.a)
	p.start(t, p.b)
	return p
}

// start runs d's daemon (again) and waits until it answers.
func (p *pair) start(t *testing.T, d *daemonProc) {
	t.Helper()
	cmd := exec.Command(p.bin, append([]string{"netns-exec", d.ns, "--", p.bin, "vnat", "run", "--iface", d.iface, "--control", d.sock, "--require-keys"}, d.args...)...)
	cmd.Stdout, cmd.Stderr = d.logs, d.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.cmd, d.done = cmd, make(chan struct{})
	done := d.done
	go func() { cmd.Wait(); close(done) }() //nolint:errcheck // its end is what the tests look at
	t.Cleanup(func() {
		select {
		case <-done:
			return
		default:
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Error(err)
		}
		<-done
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := Ask(d.sock, Request{Op: "status"}); err == nil {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("daemon %s never answered: %v\n%s\n---\n%s", d.sock, err, p.a.logs, p.b.logs)
		}
		select {
		case <-done:
			t.Fatalf("daemon in %s exited at start:\n%s", d.ns, d.logs)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// wait waits for d's daemon to exit.
func (d *daemonProc) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-d.done:
	case <-time.After(timeout):
		t.Fatalf("daemon in %s did not exit in %v:\n%s", d.ns, timeout, d.logs)
	}
}

func TestPrivilegedDaemonsKeepATCPConnectionAcrossReaddressing(t *testing.T) {
	nsA, nsB, sockA, sockB, logA, logB := pairOfDaemons(t)
	conn := dialEcho(t, nsB, nsA, "10.8.0.2:5001")
	r := bufio.NewReader(conn)
	seq := 0
	echo := func(timeout time.Duration) error {
		seq++
		msg := fmt.Sprintf("line %d\n", seq)
		if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
			return err
		}
		if _, err := conn.Write([]byte(msg)); err != nil {
			return err
		}
		got, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		if got != msg {
			return fmt.Errorf("echo %q, want %q", got, msg)
		}
		return nil
	}
	for range 3 {
		if err := echo(2 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	aV := conn.LocalAddr().String()
	virtA := aV + "->10.8.0.2:5001"
	virtB := "10.8.0.2:5001->" + aV
	// The daemons key the connection at first contact (--require-keys
	// would refuse the moves otherwise).
	waitStatus(t, sockA, virtA, 10*time.Second, func(c ConnStatus) bool { return c.State == "active" && c.Keyed }, logA, logB)
	waitStatus(t, sockB, virtB, 10*time.Second, func(c ConnStatus) bool { return c.State == "active" && c.Keyed }, logA, logB)

	// A connected UDP pair beside it (found by sock_diag, migrated alike).
	var ua, ub *net.UDPConn
	if err := netns.Do(nsA, func() (err error) {
		ua, err = net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 8, 0, 1)}, &net.UDPAddr{IP: net.IPv4(10, 8, 0, 2), Port: 5002})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ua.Close()
	if err := netns.Do(nsB, func() (err error) {
		ub, err = net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 8, 0, 2), Port: 5002}, ua.LocalAddr().(*net.UDPAddr))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ub.Close()
	udpBothWays := func(what string) {
		t.Helper()
		for _, pair := range [][2]*net.UDPConn{{ua, ub}, {ub, ua}} {
			msg := fmt.Sprintf("%s from %s", what, pair[0].LocalAddr())
			if _, err := pair[0].Write([]byte(msg)); err != nil {
				t.Fatal(err)
			}
			if err := pair[1].SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 256)
			k, err := pair[1].Read(buf)
			if err != nil || string(buf[:k]) != msg {
				t.Fatalf("udp %s: got %q, %v; want %q\n%s\n---\n%s", what, buf[:k], err, msg, logA, logB)
			}
		}
	}
	udpBothWays("before any move")
	uaV := ua.LocalAddr().String()
	udpA := uaV + "->10.8.0.2:5002"
	waitStatus(t, sockA, udpA, 10*time.Second, func(c ConnStatus) bool { return c.Proto == "udp" && c.Keyed }, logA, logB)
	waitStatus(t, sockB, "10.8.0.2:5002->"+uaV, 10*time.Second, func(c ConnStatus) bool { return c.Proto == "udp" && c.Keyed }, logA, logB)

	// b moves to 10.8.1.3: only `ip`; the daemons do the rest.
	ipIn(t, nsB, "addr", "del", "10.8.0.2/24", "dev", "b0")
	ipIn(t, nsB, "addr", "add", "10.8.1.3/24", "dev", "b0")
	ipIn(t, nsB, "route", "add", "10.8.0.0/24", "dev", "b0") // the new subnet's router, in effect
	ipIn(t, nsA, "route", "add", "10.8.1.0/24", "dev", "a0")
	ipIn(t, nsA, "neigh", "flush", "dev", "a0")
	waitStatus(t, sockB, virtB, 10*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == "10.8.1.3:5001->"+aV
	}, logA, logB)
	waitStatus(t, sockA, virtA, 10*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == aV+"->10.8.1.3:5001"
	}, logA, logB)
	for range 10 {
		if err := echo(5 * time.Second); err != nil {
			t.Fatalf("after b moved: %v\n%s\n---\n%s", err, logA, logB)
		}
	}
	waitStatus(t, sockA, udpA, 10*time.Second, func(c ConnStatus) bool { return c.State == "migrated" }, logA, logB)
	udpBothWays("after b moved")

	// Then a moves to 10.8.2.4.
	ipIn(t, nsA, "addr", "del", "10.8.0.1/24", "dev", "a0")
	ipIn(t, nsA, "addr", "add", "10.8.2.4/24", "dev", "a0")
	ipIn(t, nsA, "route", "replace", "10.8.1.0/24", "dev", "a0")
	ipIn(t, nsB, "route", "add", "10.8.2.0/24", "dev", "b0")
	ipIn(t, nsB, "neigh", "flush", "dev", "b0")
	aP := "10.8.2.4:" + aV[strings.LastIndexByte(aV, ':')+1:]
	waitStatus(t, sockA, virtA, 10*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == aP+"->10.8.1.3:5001"
	}, logA, logB)
	waitStatus(t, sockB, virtB, 10*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == "10.8.1.3:5001->"+aP
	}, logA, logB)
	for range 10 {
		if err := echo(5 * time.Second); err != nil {
			t.Fatalf("after both moved: %v\n%s\n---\n%s", err, logA, logB)
		}
	}
	waitStatus(t, sockA, udpA, 10*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && strings.HasPrefix(c.Physical, "10.8.2.4:")
	}, logA, logB)
	udpBothWays("after both moved")
	// How long each restore took, from the daemons' own logs.
	for _, l := range []*syncBuf{logA, logB} {
		for _, line := range strings.Split(l.String(), "\n") {
			if strings.Contains(line, "msg=\"vnat: restored\"") {
				t.Log(line)
			}
		}
	}
}

// Many connections with one peer: 300 TCP connections are keyed at first
// contact and restored by one move, every one of them carries on, and the
// daemon's log says how long the restore took.
func TestPrivilegedDaemonsRestoreManyConnections(t *testing.T) {
	const conns = 300
	nsA, nsB, sockA, sockB, logA, logB := pairOfDaemons(t)
	var ln net.Listener
	if err := netns.Do(nsB, func() (err error) {
		ln, err = net.Listen("tcp4", "10.8.0.2:5001")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				for {
					k, err := c.Read(buf)
					if err != nil {
						return
					}
					if _, err := c.Write(buf[:k]); err != nil {
						return
					}
				}
			}()
		}
	}()
	cs := make([]net.Conn, conns)
	if err := netns.Do(nsA, func() error {
		for i := range cs {
			c, err := net.DialTimeout("tcp4", "10.8.0.2:5001", 2*time.Second)
			if err != nil {
				return err
			}
			cs[i] = c
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	ping := func(what string) {
		t.Helper()
		for i, c := range cs {
			msg := fmt.Sprintf("c%d", i)
			if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Write([]byte(msg)); err != nil {
				t.Fatalf("%s: connection %d: %v", what, i, err)
			}
			buf := make([]byte, 64)
			k, err := c.Read(buf)
			if err != nil || string(buf[:k]) != msg {
				t.Fatalf("%s: connection %d: %q, %v\n%s\n---\n%s", what, i, buf[:k], err, logA, logB)
			}
		}
	}
	ping("before the move")
	count := func(sock, state string, keyed bool) int {
		r, err := Ask(sock, Request{Op: "status"})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range r.Conns {
			if c.State == state && (!keyed || c.Keyed) {
				n++
			}
		}
		return n
	}
	waitCount := func(what, sock, state string, keyed bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for count(sock, state, keyed) < conns {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d of %d connections %s (keyed %v)\n%s\n---\n%s", what, count(sock, state, keyed), conns, state, keyed, logA, logB)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitCount("a keyed", sockA, "active", true)
	waitCount("b keyed", sockB, "active", true)

	// The routes first this time, then the address: the restore is not
	// held up by routing (what it costs itself).
	ipIn(t, nsB, "route", "add", "10.8.0.1/32", "dev", "b0")
	ipIn(t, nsA, "route", "add", "10.8.1.0/24", "dev", "a0")
	ipIn(t, nsB, "addr", "del", "10.8.0.2/24", "dev", "b0")
	ipIn(t, nsB, "addr", "add", "10.8.1.3/24", "dev", "b0")
	ipIn(t, nsB, "route", "replace", "10.8.0.0/24", "dev", "b0")
	ipIn(t, nsA, "neigh", "flush", "dev", "a0")
	waitCount("b migrated", sockB, "migrated", true)
	waitCount("a migrated", sockA, "migrated", true)
	ping("after the move")
	for _, line := range strings.Split(logB.String(), "\n") {
		if strings.Contains(line, `msg="vnat: restored"`) {
			t.Log(line)
		}
	}
}
