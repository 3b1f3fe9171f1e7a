package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/lisp"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// lab is the test topology: user -- gw -- two shaped veth paths -- srv.
type lab struct {
	user, gw, srv string
	xtr           string // between the paths and srv (newLISPLab), or ""
	sock          string
	logs          *testenv.Buffer
	daemon        *netnstest.Daemon
	bin           string
}

const (
	srvEID      = "10.88.0.10" // mapped: the data center's EID prefix 10.88.0.0/24
	srvUnmapped = "10.99.0.10" // no mapping: forwarded natively
	gwEID1      = "10.77.0.1"
	gwEID2      = "10.77.0.2"
)

// newLab builds the namespaces (named gw-*-<random>) and shapes both paths
// with tbf at rate; everything goes with the namespaces in Cleanup.
func newLab(t testing.TB, rate string) *lab {
	t.Helper()
	return newLabPrefix(t, "gw", rate)
}

// newLabPrefix is newLab with the namespaces named prefix-*-<random>.
func newLabPrefix(t testing.TB, prefix, rate string) *lab {
	t.Helper()
	testenv.RequireRoot(t, "network namespaces, nftables, MPTCP path manager")
	testenv.RequireTool(t, "ip", "tc", "nft", "ss", "go")
	l := &lab{user: netnstest.New(t, prefix+"-user"), gw: netnstest.New(t, prefix+"-gw"), srv: netnstest.New(t, prefix+"-srv")}
	netnstest.Veth(t, "u0", l.user, "g0", l.gw)
	netnstest.Veth(t, "p1", l.gw, "s1", l.srv)
	netnstest.Veth(t, "p2", l.gw, "s2", l.srv)
	netnstest.IP(t, l.user, "addr", "add", "10.66.0.2/24", "dev", "u0")
	netnstest.IP(t, l.user, "route", "add", "default", "via", "10.66.0.1")
	netnstest.IP(t, l.gw, "addr", "add", "10.66.0.1/24", "dev", "g0")
	netnstest.IP(t, l.gw, "addr", "add", "192.168.71.1/30", "dev", "p1")
	netnstest.IP(t, l.gw, "addr", "add", "192.168.72.1/30", "dev", "p2")
	/* the unmapped prefix is reached by the gateway's ordinary routes */
	netnstest.IP(t, l.gw, "route", "add", "10.99.0.0/24", "via", "192.168.72.2")
	netnstest.IP(t, l.srv, "addr", "add", "192.168.71.2/30", "dev", "s1")
	netnstest.IP(t, l.srv, "addr", "add", "192.168.72.2/30", "dev", "s2")
	netnstest.IP(t, l.srv, "addr", "add", srvEID+"/32", "dev", "lo")
	netnstest.IP(t, l.srv, "addr", "add", srvUnmapped+"/32", "dev", "lo")
	netnstest.IP(t, l.srv, "route", "add", gwEID1, "via", "192.168.71.1")
	netnstest.IP(t, l.srv, "route", "add", gwEID2, "via", "192.168.72.1")
	/* the server accepts joins (up to 8 subflows) and announces nothing */
	netnstest.IP(t, l.srv, "mptcp", "limits", "set", "subflows", "8", "add_addr_accepted", "0")
	if rate != "" {
		for _, x := range [][2]string{{l.gw, "p1"}, {l.gw, "p2"}, {l.srv, "s1"}, {l.srv, "s2"}} {
			run(t, "tc", "-n", x[0], "qdisc", "add", "dev", x[1], "root", "tbf", "rate", rate, "burst", "64kb", "latency", "20ms")
		}
	}
	l.bin = netnstest.Onehop(t)
	l.sock = filepath.Join(t.TempDir(), "gw.sock")
	return l
}

// start runs the real `onehop gateway run` in gw.
func (l *lab) start(t testing.TB, extra ...string) {
	t.Helper()
	if len(extra) == 0 {
		extra = []string{"--map", "10.88.0.0/24=192.168.71.2,192.168.72.2"}
	}
	l.startOnly(t, append([]string{
		"--path", "dev=p1,eid=" + gwEID1 + ",rloc=192.168.71.1,name=wan1",
		"--path", "dev=p2,eid=" + gwEID2 + ",rloc=192.168.72.1,name=wan2"}, extra...)...)
}

// startOnly runs the gateway with the paths and mappings in args.
func (l *lab) startOnly(t testing.TB, args ...string) {
	t.Helper()
	base := []string{"netns-exec", l.gw, "--", l.bin, "gateway", "run", "--control", l.sock,
		"--intercept", "g0", "--eid-prefix", "10.77.0.0/24"}
	l.launch(t, exec.Command(l.bin, append(base, args...)...))
}

// launch starts cmd, a gateway daemon in gw, and waits until it answers.
func (l *lab) launch(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	l.logs = &testenv.Buffer{}
	l.daemon = netnstest.Start(t, "the gateway", l.logs, cmd)
	l.daemon.Ready(t, 30*time.Second, func() error {
		_, err := Ask(l.sock, Request{Op: "status"})
		return err
	})
}

// stop sends SIGTERM and waits for the daemon to take its setup down.
func (l *lab) stop(t testing.TB) {
	t.Helper()
	if err := l.daemon.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := l.daemon.Wait(t, 20*time.Second); err != nil {
		t.Fatalf("gateway exited with %v\n%s", err, l.logs)
	}
}

// serve serves blob to every connection on addr in srv (MPTCP or not).
func (l *lab) serve(t testing.TB, addr string, mptcp bool, blob []byte) {
	t.Helper()
	var ln net.Listener
	if err := netns.Do(l.srv, func() (err error) {
		lc := net.ListenConfig{}
		lc.SetMultipathTCP(mptcp)
		ln, err = lc.Listen(context.Background(), "tcp4", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go netnstest.Serve(ln, func(c net.Conn) {
		c.Write(blob) //nolint:errcheck // the test reads what arrived and hashes it
	})
}

// download is one plain-TCP transfer from user; got counts bytes as they come.
type download struct {
	got  atomic.Int64
	done chan struct{}
	sum  [32]byte
	n    int64
	err  error
}

func (l *lab) download(t testing.TB, addr string) *download {
	t.Helper()
	var c net.Conn
	if err := netns.Do(l.user, func() (err error) {
		d := net.Dialer{Timeout: 5 * time.Second}
		d.SetMultipathTCP(false)
		c, err = d.Dial("tcp4", addr)
		return err
	}); err != nil {
		t.Fatalf("dial %s from user: %v\n%s", addr, err, l.logs)
	}
	d := &download{done: make(chan struct{})}
	go func() {
		defer close(d.done)
		defer c.Close()
		if err := c.SetDeadline(time.Now().Add(120 * time.Second)); err != nil {
			d.err = err
			return
		}
		h := sha256.New()
		buf := make([]byte, 256<<10)
		for {
			n, err := c.Read(buf)
			h.Write(buf[:n])
			d.got.Add(int64(n))
			if err == io.EOF {
				break
			}
			if err != nil {
				d.err = err
				break
			}
		}
		d.n = d.got.Load()
		copy(d.sum[:], h.Sum(nil))
	}()
	return d
}

func (d *download) wait(t testing.TB, want []byte, logs *testenv.Buffer) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-d.done:
	case <-time.After(150 * time.Second):
		t.Fatalf("download never finished (%d bytes)\n%s", d.got.Load(), logs)
	}
	if d.err != nil {
		t.Fatalf("download: %v after %d bytes\n%s", d.err, d.n, logs)
	}
	if d.n != int64(len(want)) || d.sum != sha256.Sum256(want) {
		t.Fatalf("download: %d bytes, hash %x; want %d bytes, hash %x\n%s", d.n, d.sum, len(want), sha256.Sum256(want), logs)
	}
	return time.Since(start)
}

// waitBytes waits until d has at least n bytes.
func (d *download) waitBytes(t testing.TB, n int64, logs *testenv.Buffer) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("%d bytes of the download", n), 60*time.Second, func() error {
		if got := d.got.Load(); got < n {
			select {
			case <-d.done:
				t.Fatalf("download ended at %d bytes, before %d (err %v)", d.n, n, d.err)
			default:
			}
			return testenv.WithLogs(fmt.Errorf("stuck at %d bytes", got), logs)
		}
		return nil
	})
}

// rx returns the bytes received on gw's path links p1 and p2.
func (l *lab) rx(t testing.TB) (p1, p2 uint64) {
	t.Helper()
	h, err := netns.Handle(l.gw)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for i, n := range []string{"p1", "p2"} {
		lk, err := h.LinkByName(n)
		if err != nil {
			t.Fatal(err)
		}
		if lk.Attrs().Statistics == nil {
			t.Fatalf("%s: no statistics", n)
		}
		if i == 0 {
			p1 = lk.Attrs().Statistics.RxBytes
		} else {
			p2 = lk.Attrs().Statistics.RxBytes
		}
	}
	return p1, p2
}

// srvSubflows counts the server's established MPTCP subflows on port from
// each gateway EID (ss -tin: subflows carry "tcp-ulp-mptcp").
func (l *lab) srvSubflows(t testing.TB, port string) map[string]int {
	t.Helper()
	out := run(t, "ip", "netns", "exec", l.srv, "ss", "-tinH", "state", "established", "( sport = :"+port+" )")
	got := map[string]int{}
	lines := strings.Split(out, "\n")
	for i := 0; i+1 < len(lines); i++ {
		f := strings.Fields(lines[i])
		if len(f) < 4 || !strings.Contains(lines[i+1], "tcp-ulp-mptcp") {
			continue
		}
		peer, _, _ := strings.Cut(f[3], ":")
		got[peer]++
	}
	return got
}

// conn waits for the status of the connection from client to dest to
// satisfy cond.
func (l *lab) conn(t testing.TB, dest string, cond func(ConnStatus) bool) ConnStatus {
	t.Helper()
	var found ConnStatus
	testenv.Eventually(t, "a connection to "+dest+" in the state wanted", 30*time.Second, func() error {
		last, err := Ask(l.sock, Request{Op: "status"})
		if err == nil {
			for i := len(last.Conns) - 1; i >= 0; i-- {
				if c := last.Conns[i]; c.Dest == dest && cond(c) {
					found = c
					return nil
				}
			}
			err = fmt.Errorf("last status %+v", last)
		}
		return testenv.WithLogs(err, l.logs)
	})
	return found
}

// waitPath waits until status shows the path up or down.
func (l *lab) waitPath(t testing.TB, name string, up bool) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("path %s up=%v", name, up), 10*time.Second, func() error {
		r, err := Ask(l.sock, Request{Op: "status"})
		if err == nil {
			for _, p := range r.Paths {
				if p.Name == name && p.Up == up {
					return nil
				}
			}
			err = fmt.Errorf("paths %+v", r.Paths)
		}
		return testenv.WithLogs(err, l.logs)
	})
}

func liveOn(c ConnStatus, path string) bool {
	for _, s := range c.Subflows {
		if s.Path == path && s.State == "established" {
			return true
		}
	}
	return false
}

// The namespace test, without LISP (each path is pinned by source
// rules): a plain-TCP download by a user who knows nothing of the gateway
// gets two subflows on two paths; it survives wan1's link going down with
// its hash intact, wan1's subflow coming back to the same connection when
// the link does; a new transfer uses both paths again. A server without
// MPTCP gets plain TCP; an unmapped address goes natively. The daemon
// removes its nftables table, rules and EIDs on exit.
func TestPrivilegedGatewayTwoPathsSurviveAPathCut(t *testing.T) {
	l := newLab(t, "100mbit")
	blob := make([]byte, 64<<20)
	if _, err := rand.Read(blob); err != nil {
		t.Fatal(err)
	}
	small := blob[:24<<20]
	l.serve(t, srvEID+":5201", true, blob)
	l.serve(t, srvEID+":5202", false, small)
	l.serve(t, srvUnmapped+":5201", false, small)
	l.serve(t, srvEID+":5203", true, small)

	/* without the gateway the user reaches nothing (gw does not forward) */
	if err := netns.Do(l.user, func() error {
		c, err := net.DialTimeout("tcp4", srvEID+":5201", time.Second)
		if err == nil {
			c.Close()
			return fmt.Errorf("user reached %s without the gateway", srvEID)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	l.start(t)
	/* the gateway's own address and listen port is no way in: a
	   listener there would proxy the connection to itself, forever */
	if err := netns.Do(l.user, func() error {
		c, err := net.DialTimeout("tcp4", fmt.Sprintf("10.66.0.1:%d", DefaultListenPort), time.Second)
		if err == nil {
			c.Close()
			return fmt.Errorf("user reached the gateway's listener directly")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	dest := srvEID + ":5201"
	d := l.download(t, dest)
	d.waitBytes(t, 6<<20, l.logs)
	c := l.conn(t, dest, func(c ConnStatus) bool { return liveOn(c, "wan1") && liveOn(c, "wan2") })
	if c.Mode != ModeMPTCP {
		t.Fatalf("mode %s, want mptcp: %+v", c.Mode, c)
	}
	if ss := l.srvSubflows(t, "5201"); ss[gwEID1] != 1 || ss[gwEID2] != 1 {
		t.Fatalf("server's MPTCP subflows by peer %v; want one from %s and one from %s", ss, gwEID1, gwEID2)
	}
	/* ss -M: the server's MPTCP socket counts one joined subflow */
	if out := run(t, "ip", "netns", "exec", l.srv, "ss", "-MiH", "state", "established"); !strings.Contains(out, " subflows:1 ") {
		t.Fatalf("server's ss -Mi shows no joined subflow:\n%s", out)
	}
	if out := run(t, "ip", "netns", "exec", l.gw, "ss", "-tinH", "state", "established", "( dport = :5201 )"); strings.Count(out, "cubic") < 2 || strings.Contains(out, "bbr") {
		t.Fatalf("gw's subflows are not all cubic:\n%s", out)
	}
	a1, a2 := l.rx(t)
	d.waitBytes(t, 16<<20, l.logs)
	b1, b2 := l.rx(t)
	if b1-a1 < 2<<20 || b2-a2 < 2<<20 {
		t.Fatalf("10 MiB downloaded but path links received %d and %d bytes: not both paths", b1-a1, b2-a2)
	}

	/* cut wan1 on the gateway's side */
	netnstest.IP(t, l.gw, "link", "set", "p1", "down")
	c = l.conn(t, dest, func(c ConnStatus) bool { return !liveOn(c, "wan1") && liveOn(c, "wan2") })
	a1, a2 = l.rx(t)
	got := d.got.Load()
	d.waitBytes(t, got+8<<20, l.logs)
	b1, b2 = l.rx(t)
	if b1 != a1 || b2-a2 < 4<<20 {
		t.Fatalf("wan1 down: 8 MiB more arrived with %d bytes on p1 and %d on p2; want 0 and all", b1-a1, b2-a2)
	}

	/* wan1 back: the same connection gets its subflow again */
	netnstest.IP(t, l.gw, "link", "set", "p1", "up")
	c = l.conn(t, dest, func(c ConnStatus) bool { return liveOn(c, "wan1") && liveOn(c, "wan2") })
	a1, _ = l.rx(t)
	d.wait(t, blob, l.logs)
	b1, _ = l.rx(t)
	t.Logf("after wan1 came back the same connection received %d bytes on p1", b1-a1)

	/* a new transfer uses both paths */
	a1, a2 = l.rx(t)
	start := time.Now()
	d2 := l.download(t, srvEID+":5203")
	d2.wait(t, small, l.logs)
	both := time.Since(start)
	b1, b2 = l.rx(t)
	if b1-a1 < 4<<20 || b2-a2 < 4<<20 {
		t.Fatalf("new 24 MiB transfer after wan1 came back: %d bytes on p1, %d on p2; want both used", b1-a1, b2-a2)
	}
	c2 := l.conn(t, srvEID+":5203", func(c ConnStatus) bool { return !c.Open })
	var withBytes int
	for _, s := range c2.Subflows {
		if s.BytesReceived > 4<<20 {
			withBytes++
		}
	}
	if withBytes != 2 {
		t.Fatalf("status of the new transfer: want two subflows with > 4 MiB each: %+v", c2.Subflows)
	}

	/* one path for comparison: the same transfer with wan1 down */
	netnstest.IP(t, l.gw, "link", "set", "p1", "down")
	l.waitPath(t, "wan1", false)
	start = time.Now()
	d3 := l.download(t, srvEID+":5203")
	d3.wait(t, small, l.logs)
	one := time.Since(start)
	netnstest.IP(t, l.gw, "link", "set", "p1", "up")
	t.Logf("24 MiB: two paths %v (%.0f Mbit/s), one path %v (%.0f Mbit/s): %.2fx",
		both, float64(len(small))*8/both.Seconds()/1e6, one, float64(len(small))*8/one.Seconds()/1e6, one.Seconds()/both.Seconds())

	/* a server without MPTCP: plain TCP over the best RLOC */
	d4 := l.download(t, srvEID+":5202")
	d4.wait(t, small, l.logs)
	c4 := l.conn(t, srvEID+":5202", func(c ConnStatus) bool { return !c.Open })
	if c4.Mode != ModeTCPFallback || len(c4.Subflows) != 1 || c4.Subflows[0].BytesReceived < uint64(len(small)) || c4.Subflows[0].RLOC == "" {
		t.Fatalf("server without MPTCP: want mode %s with its one TCP connection on a path: %+v", ModeTCPFallback, c4)
	}
	/* no mapping: native */
	d5 := l.download(t, srvUnmapped+":5201")
	d5.wait(t, small, l.logs)
	c5 := l.conn(t, srvUnmapped+":5201", func(c ConnStatus) bool { return !c.Open })
	if c5.Mode != ModeNative || len(c5.Subflows) != 0 {
		t.Fatalf("unmapped destination: mode %s, want native: %+v", c5.Mode, c5)
	}
	out, err := exec.Command(l.bin, "gateway", "status", "--control", l.sock).CombinedOutput()
	if err != nil {
		t.Fatalf("gateway status: %v: %s", err, out)
	}
	t.Logf("onehop gateway status:\n%s", out)

	l.stop(t)
	if out := run(t, "ip", "netns", "exec", l.gw, "nft", "list", "tables"); strings.Contains(out, NFTTable) {
		t.Fatalf("table %s left behind:\n%s", NFTTable, out)
	}
	if out := run(t, "ip", "-n", l.gw, "rule", "show"); strings.Contains(out, gwEID1) || strings.Contains(out, "fwmark") {
		t.Fatalf("ip rules left behind:\n%s", out)
	}
	if out := run(t, "ip", "-n", l.gw, "addr", "show", "dev", "lo"); strings.Contains(out, gwEID1) {
		t.Fatalf("EID left on lo:\n%s", out)
	}
}

// With a LISP map-resolver (internal/lisp's Map-Request/Map-Reply, a fake
// map-server in gw's namespace): the destination's record has wan2's RLOC
// at priority 255, so its connection gets one subflow, on wan1, and the
// server sees one subflow; an EID the map-server does not hold gets a
// negative reply and goes natively.
func TestPrivilegedGatewayAsksTheMapResolverAndSkipsUnusableRLOCs(t *testing.T) {
	l := newLab(t, "100mbit")
	held := []lisp.Record{{
		EID: netip.MustParsePrefix("10.88.0.0/24"), TTL: 10 * time.Minute,
		Locators: []lisp.Locator{
			{Addr: netip.MustParseAddr("192.168.71.2"), Priority: 1, Weight: 50},
			{Addr: netip.MustParseAddr("192.168.72.2"), Priority: 255, Weight: 50},
		},
	}}
	var mr netip.AddrPort
	if err := netns.Do(l.gw, func() error {
		mr = fakeMapResolver(t, "127.0.0.1:4342", held)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	blob := make([]byte, 24<<20)
	if _, err := rand.Read(blob); err != nil {
		t.Fatal(err)
	}
	l.serve(t, srvEID+":5201", true, blob)
	l.serve(t, srvUnmapped+":5201", false, blob)
	l.start(t, "--map-resolver", mr.String())

	d := l.download(t, srvEID+":5201")
	d.waitBytes(t, 1, l.logs)
	c := l.conn(t, srvEID+":5201", func(c ConnStatus) bool { return liveOn(c, "wan1") })
	if ss := l.srvSubflows(t, "5201"); ss[gwEID1] != 1 || ss[gwEID2] != 0 {
		t.Fatalf("server's subflows by peer %v: want one, from %s (wan2's RLOC has priority 255)", ss, gwEID1)
	}
	d.wait(t, blob, l.logs)
	c = l.conn(t, srvEID+":5201", func(c ConnStatus) bool { return !c.Open })
	if c.Mode != ModeMPTCP || len(c.Subflows) != 1 || c.Subflows[0].Path != "wan1" || c.Subflows[0].RLOC != "192.168.71.2" {
		t.Fatalf("status: want one subflow on wan1 to RLOC 192.168.71.2: %+v", c)
	}
	d = l.download(t, srvUnmapped+":5201")
	d.wait(t, blob, l.logs)
	c = l.conn(t, srvUnmapped+":5201", func(c ConnStatus) bool { return !c.Open })
	if c.Mode != ModeNative || !strings.Contains(c.Why, "negative") {
		t.Fatalf("unmapped: want native after a negative map-reply: %+v", c)
	}
	l.stop(t)
}

// wan1 dies beyond the gateway's link (the server's side drops everything
// arriving on it; the gateway's link stays up): a new connection's initial
// subflow on wan1 gets no answer, so after initialAttempt the gateway
// connects over wan2 instead, and the download completes with its hash.
func TestPrivilegedGatewaySurvivesAPathDyingBeyondItsLink(t *testing.T) {
	l := newLab(t, "100mbit")
	blob := make([]byte, 8<<20)
	if _, err := rand.Read(blob); err != nil {
		t.Fatal(err)
	}
	l.serve(t, srvEID+":5201", true, blob)
	l.start(t)
	drop := exec.Command("ip", "netns", "exec", l.srv, "nft", "-f", "-")
	drop.Stdin = strings.NewReader("table ip gwtest {\n chain in {\n  type filter hook prerouting priority raw;\n  iifname \"s1\" drop\n }\n}\n")
	if out, err := drop.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	start := time.Now()
	d := l.download(t, srvEID+":5201")
	d.wait(t, blob, l.logs)
	took := time.Since(start)
	c := l.conn(t, srvEID+":5201", func(c ConnStatus) bool { return !c.Open })
	var wan2 uint64
	for _, s := range c.Subflows {
		if s.Path == "wan2" {
			wan2 = s.BytesReceived
		}
	}
	if c.Mode != ModeMPTCP || wan2 < uint64(len(blob)) {
		t.Fatalf("want the download carried by wan2's subflow: %+v", c)
	}
	if took < initialAttempt || took > initialAttempt+8*time.Second {
		t.Fatalf("download took %v; want the initial attempt on wan1 (%v) and then wan2's pace", took, initialAttempt)
	}
	if r, err := Ask(l.sock, Request{Op: "status"}); err != nil || r.Counters["dial_errors"] != 1 {
		t.Fatalf("counters %v, %v: want one dial error (wan1)", r.Counters, err)
	}

	/* healed, then dead again in the middle of a download on both paths:
	   MPTCP moves the data to wan2 by itself (the gateway sees no link
	   change) and the content arrives whole */
	nodrop := exec.Command("ip", "netns", "exec", l.srv, "nft", "delete", "table", "ip", "gwtest")
	if out, err := nodrop.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	big := make([]byte, 48<<20)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	l.serve(t, srvEID+":5202", true, big)
	d = l.download(t, srvEID+":5202")
	d.waitBytes(t, 4<<20, l.logs)
	l.conn(t, srvEID+":5202", func(c ConnStatus) bool { return liveOn(c, "wan1") && liveOn(c, "wan2") })
	drop = exec.Command("ip", "netns", "exec", l.srv, "nft", "-f", "-")
	drop.Stdin = strings.NewReader("table ip gwtest {\n chain in {\n  type filter hook prerouting priority raw;\n  iifname \"s1\" drop\n }\n}\n")
	if out, err := drop.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	cut := time.Now()
	d.wait(t, big, l.logs)
	t.Logf("download finished %v after wan1 died beyond the gateway's link", time.Since(cut))
}

// TestPrivilegedGatewayNeverForwardsUsersToInfrastructure is the attack
// run's: a user behind the gateway reached the controller's API (401, but
// reached) through the gateway's native forwarding. Here the "controller"
// (an API listener at 10.99.0.1:8443) sits in the natively routed prefix
// and the gateway forwards IP (as the lab's does). The controls: a native
// download and a ping to a server of that prefix work, and the API is up
// (the gateway's own namespace connects to it). The attack: the user's
// TCP to the API and ping to it are dropped, counted
// infrastructure_dropped, and the API never sees a connection from them.
func TestPrivilegedGatewayNeverForwardsUsersToInfrastructure(t *testing.T) {
	testenv.RequireTool(t, "ping")
	l := newLab(t, "")
	const api = "10.99.0.1:8443"
	netnstest.IP(t, l.srv, "addr", "add", "10.99.0.1/32", "dev", "lo")
	netnstest.IP(t, l.srv, "route", "add", "10.66.0.0/24", "via", "192.168.72.1") // the users, for the pings
	if err := netns.WriteSysctl(l.gw, "net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	var apiConns atomic.Int64
	var ln net.Listener
	if err := netns.Do(l.srv, func() (err error) { ln, err = net.Listen("tcp4", api); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go netnstest.Serve(ln, func(c net.Conn) { apiConns.Add(1); c.Write([]byte("401 Unauthorized\n")) })
	blob := make([]byte, 256<<10)
	rand.Read(blob)
	l.serve(t, srvUnmapped+":5201", false, blob)
	l.start(t, "--map", "10.88.0.0/24=192.168.71.2,192.168.72.2", "--infrastructure", "10.99.0.1")
	counters := func() map[string]uint64 {
		t.Helper()
		r, err := Ask(l.sock, Request{Op: "status"})
		if err != nil {
			t.Fatal(err)
		}
		return r.Counters
	}
	ping := func(dst string) error {
		return exec.Command("ip", "netns", "exec", l.user, "ping", "-c", "1", "-W", "2", dst).Run()
	}

	// Controls.
	d := l.download(t, srvUnmapped+":5201")
	d.wait(t, blob, l.logs)
	if c := l.conn(t, srvUnmapped+":5201", func(c ConnStatus) bool { return !c.Open }); c.Mode != ModeNative {
		t.Fatalf("control download: mode %s, want native", c.Mode)
	}
	if err := ping(srvUnmapped); err != nil {
		t.Fatalf("control: the user cannot ping %s through the gateway: %v", srvUnmapped, err)
	}
	if err := netns.Do(l.gw, func() error {
		c, err := net.DialTimeout("tcp4", api, 5*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		t.Fatalf("control: the API is not up (the gateway's own dial): %v", err)
	}
	testenv.Eventually(t, "the API's one connection", 5*time.Second, func() bool { return apiConns.Load() == 1 })
	before, ok := counters()["infrastructure_dropped"]
	if !ok {
		t.Fatalf("status has no infrastructure_dropped counter: %v", counters())
	}

	// The attack.
	err := netns.Do(l.user, func() error {
		d := net.Dialer{Timeout: 3 * time.Second}
		d.SetMultipathTCP(false)
		c, err := d.Dial("tcp4", api)
		if err == nil {
			b, _ := io.ReadAll(c)
			c.Close()
			return fmt.Errorf("connected, read %q", b)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the user reached the API through the gateway: %v", err)
	}
	if ping("10.99.0.1") == nil {
		t.Fatal("the user's ping reached the API's address through the gateway")
	}
	if got := counters()["infrastructure_dropped"] - before; got < 2 {
		t.Fatalf("infrastructure_dropped moved by %d, want at least 2 (the SYN and the ping)", got)
	}
	if n := apiConns.Load(); n != 1 {
		t.Fatalf("the API saw %d connections, want only the gateway's own", n)
	}
}
