package vnatd

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// The fixture of this package's TestPrivileged* tests: two VNAT daemons on
// a veth pair, and what the tests do with them (connections between the
// two ends, moves, waits on the daemons' status).

// pair is two namespaces joined by a veth (a0 10.8.0.1/24 in nsA, b0
// 10.8.0.2/24 in nsB) with the real `onehop vnat run` (keys required, the default) in
// each, as the lab starts it.
type pair struct {
	nsA, nsB string
	bin, dir string
	a, b     *daemonProc
}

// daemonProc is one `onehop vnat run`; a restart keeps its socket and log.
type daemonProc struct {
	ns, iface string
	args      []string
	sock      string
	logs      *testenv.Buffer
	proc      *netnstest.Daemon // the running process, since the last start
}

// newPair builds the pair, with more `vnat run` flags for a and b, and
// waits until both daemons answer.
func newPair(t *testing.T, argsA, argsB []string) *pair {
	t.Helper()
	testenv.RequireRoot(t, "network namespaces and BPF")
	testenv.RequireTool(t, "ip", "go")
	p := &pair{nsA: netnstest.New(t, "vnatd-a"), nsB: netnstest.New(t, "vnatd-b")}
	netnstest.Veth(t, "a0", p.nsA, "b0", p.nsB)
	netnstest.IP(t, p.nsA, "addr", "add", "10.8.0.1/24", "dev", "a0")
	netnstest.IP(t, p.nsB, "addr", "add", "10.8.0.2/24", "dev", "b0")
	p.bin = netnstest.Onehop(t)
	p.dir = t.TempDir()
	p.a = &daemonProc{ns: p.nsA, iface: "a0", args: argsA, sock: filepath.Join(p.dir, p.nsA+".sock"), logs: &testenv.Buffer{}}
	p.b = &daemonProc{ns: p.nsB, iface: "b0", args: argsB, sock: filepath.Join(p.dir, p.nsB+".sock"), logs: &testenv.Buffer{}}
	p.start(t, p.a)
	p.start(t, p.b)
	return p
}

// start runs d's daemon (again) and waits until it answers.
func (p *pair) start(t *testing.T, d *daemonProc) {
	t.Helper()
	cmd := exec.Command(p.bin, append([]string{"netns-exec", d.ns, "--", p.bin, "vnat", "run", "--iface", d.iface, "--control", d.sock}, d.args...)...)
	d.proc = netnstest.Start(t, "the vnat daemon in "+d.ns, d.logs, cmd)
	d.proc.Ready(t, 20*time.Second, func() error {
		_, err := Ask(d.sock, Request{Op: "status"})
		return err
	})
}

// wait waits for d's daemon to exit.
func (d *daemonProc) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	d.proc.Wait(t, timeout) //nolint:errcheck // how it ended is in its log; the tests look at what it left
}

// term ends d's daemon with SIGTERM, as a service manager would, and waits
// for it to exit.
func (d *daemonProc) term(t *testing.T) {
	t.Helper()
	if err := d.proc.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	d.wait(t, 10*time.Second)
}

// waitStatus asks the daemon behind sock until cond holds for the
// connection named by virtual, or fails after timeout with the logs.
func waitStatus(t *testing.T, sock, virtual string, timeout time.Duration, cond func(ConnStatus) bool, logs ...*testenv.Buffer) ConnStatus {
	t.Helper()
	var found ConnStatus
	testenv.Eventually(t, fmt.Sprintf("%s: connection %s in the state wanted", sock, virtual), timeout, func() error {
		last, err := Ask(sock, Request{Op: "status"})
		if err == nil {
			for _, c := range last.Conns {
				if c.Virtual == virtual && cond(c) {
					found = c
					return nil
				}
			}
			err = fmt.Errorf("last status %+v", last)
		}
		return testenv.WithLogs(err, logs...)
	})
	return found
}

// virtual is c's virtual tuple (a connection from a to b) as a and as b
// name it.
func (p *pair) virtual(c net.Conn) (virtA, virtB string) {
	return c.LocalAddr().String() + "->" + c.RemoteAddr().String(), c.RemoteAddr().String() + "->" + c.LocalAddr().String()
}

// waitMigrated waits until both daemons show the connection (virtA and
// virtB, as a and b name it) migrated, a's end at aAt and b's at bAt
// (ADDR:PORT each): a's status within timeout, b's 5 s after.
func (p *pair) waitMigrated(t *testing.T, virtA, virtB, aAt, bAt string, timeout time.Duration) {
	t.Helper()
	waitStatus(t, p.a.sock, virtA, timeout, func(s ConnStatus) bool {
		return s.State == "migrated" && s.Physical == aAt+"->"+bAt
	}, p.a.logs, p.b.logs)
	waitStatus(t, p.b.sock, virtB, 5*time.Second, func(s ConnStatus) bool {
		return s.State == "migrated" && s.Physical == bAt+"->"+aAt
	}, p.a.logs, p.b.logs)
}

// localPort is c's local port, as ":PORT".
func localPort(c net.Conn) string {
	return ":" + strconv.Itoa(c.LocalAddr().(*net.TCPAddr).Port)
}

// waitKeyed waits until both daemons keyed c (a connection from a to b)
// and returns its virtual tuple as a and as b name it.
func (p *pair) waitKeyed(t *testing.T, c net.Conn) (virtA, virtB string) {
	t.Helper()
	virtA, virtB = p.virtual(c)
	waitStatus(t, p.a.sock, virtA, 10*time.Second, func(c ConnStatus) bool { return c.Keyed }, p.a.logs, p.b.logs)
	waitStatus(t, p.b.sock, virtB, 10*time.Second, func(c ConnStatus) bool { return c.Keyed }, p.a.logs, p.b.logs)
	return virtA, virtB
}

// keyedEcho connects a to a line echo server at 10.8.0.2:5001 in b, sends
// a first line, and waits until both daemons keyed the connection; echo
// sends the next line.
func (p *pair) keyedEcho(t *testing.T) (c net.Conn, echo func(what string) error) {
	t.Helper()
	c = dialEcho(t, p.nsB, p.nsA, "10.8.0.2:5001")
	echo = numberedEcho(c)
	if err := echo("before"); err != nil {
		t.Fatal(err)
	}
	p.waitKeyed(t, c)
	return c, echo
}

// countConns counts the keyed connections to or from port the daemon
// behind sock has in state.
func countConns(t *testing.T, sock, state, port string) int {
	t.Helper()
	r, err := Ask(sock, Request{Op: "status"})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range r.Conns {
		local, remote, _ := strings.Cut(c.Virtual, "->")
		if c.State == state && c.Keyed && (strings.HasSuffix(local, ":"+port) || strings.HasSuffix(remote, ":"+port)) {
			n++
		}
	}
	return n
}

// waitConns waits until the daemon behind sock has n keyed connections to
// or from port in state.
func (p *pair) waitConns(t *testing.T, what, sock, state, port string, n int, timeout time.Duration) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("%s: %d connections %s and keyed", what, n, state), timeout, func() error {
		if k := countConns(t, sock, state, port); k < n {
			return testenv.WithLogs(fmt.Errorf("%d of them", k), p.a.logs, p.b.logs)
		}
		return nil
	})
}

// moveB re-addresses b to 10.8.1.3/24 with `ip` and nothing else (the
// daemons do the rest): its address first, then the routes that make the
// new subnet reachable, as a host that moved would see it.
func (p *pair) moveB(t *testing.T) {
	t.Helper()
	netnstest.IP(t, p.nsB, "addr", "del", "10.8.0.2/24", "dev", "b0")
	netnstest.IP(t, p.nsB, "addr", "add", "10.8.1.3/24", "dev", "b0")
	netnstest.IP(t, p.nsB, "route", "add", "10.8.0.0/24", "dev", "b0") // the new subnet's router, in effect
	netnstest.IP(t, p.nsA, "route", "add", "10.8.1.0/24", "dev", "a0")
	flushNeigh(t, p.nsA, "a0")
}

// moveBRoutesFirst is moveB with the routes in place before the address
// changes: the restore is not held up by routing (what it costs itself).
func (p *pair) moveBRoutesFirst(t *testing.T) {
	t.Helper()
	netnstest.IP(t, p.nsB, "route", "add", "10.8.0.1/32", "dev", "b0")
	netnstest.IP(t, p.nsA, "route", "add", "10.8.1.0/24", "dev", "a0")
	netnstest.IP(t, p.nsB, "addr", "del", "10.8.0.2/24", "dev", "b0")
	netnstest.IP(t, p.nsB, "addr", "add", "10.8.1.3/24", "dev", "b0")
	netnstest.IP(t, p.nsB, "route", "replace", "10.8.0.0/24", "dev", "b0")
	flushNeigh(t, p.nsA, "a0")
}

// flushNeigh forgets dev's neighbours in ns, as a host does when the
// peer's old address stops answering. A test whose connections keep
// sending meanwhile makes the kernel create entries again as fast as `ip`
// deletes them (new, incomplete: they name no link address), and `ip`
// gives up after ten rounds ("Flush not complete"); the entries that were
// there are gone by then, which is what the move needs.
func flushNeigh(t *testing.T, ns, dev string) {
	t.Helper()
	out, err := exec.Command("ip", "-n", ns, "neigh", "flush", "dev", dev).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "Flush not complete") {
		t.Fatalf("ip -n %s neigh flush dev %s: %v: %s", ns, dev, err, out)
	}
}

// dialMany opens n connections from a to addr, closed when t ends.
func (p *pair) dialMany(t *testing.T, n int, addr string, timeout time.Duration) []net.Conn {
	t.Helper()
	cs := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range cs {
			c.Close()
		}
	})
	if err := netns.Do(p.nsA, func() error {
		for range n {
			c, err := net.DialTimeout("tcp4", addr, timeout)
			if err != nil {
				return err
			}
			cs = append(cs, c)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return cs
}

// echoLines serves ln: every connection echoes its lines.
func echoLines(ln net.Listener) { netnstest.Serve(ln, echoConn) }

// echoConn sends c's lines back until either side fails, then closes it.
func echoConn(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := c.Write([]byte(line)); err != nil {
			return
		}
	}
}

// echoBytes serves ln: every connection sends back whatever arrives, as it
// arrives.
func echoBytes(ln net.Listener) {
	netnstest.Serve(ln, func(c net.Conn) {
		buf := make([]byte, 4096)
		for {
			k, err := c.Read(buf)
			if err != nil {
				return
			}
			if _, err := c.Write(buf[:k]); err != nil {
				return
			}
		}
	})
}

// dialEcho listens at addr in serverNS, where every connection echoes its
// lines, and dials it from clientNS; both are closed when t ends.
func dialEcho(t *testing.T, serverNS, clientNS, addr string) net.Conn {
	t.Helper()
	go echoLines(netnstest.Listen(t, serverNS, addr))
	return netnstest.Dial(t, clientNS, nil, addr, 2*time.Second)
}

// echoOnce sends a line over c and checks it comes back.
func echoOnce(c net.Conn, r *bufio.Reader, msg string) error {
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return err
	}
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return err
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != msg+"\n" {
		return fmt.Errorf("echo %q, want %q", got, msg+"\n")
	}
	return nil
}

// numberedEcho returns echo: echoOnce over c of "WHAT N", N counting the
// lines sent so far.
func numberedEcho(c net.Conn) (echo func(what string) error) {
	r := bufio.NewReader(c)
	k := 0
	return func(what string) error {
		k++
		return echoOnce(c, r, fmt.Sprintf("%s %d", what, k))
	}
}
