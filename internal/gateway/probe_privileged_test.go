package gateway

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/lisp"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/ratelog"
	"github.com/onehop/onehop/internal/testenv"
	"github.com/onehop/onehop/internal/xtr"
)

// startSelf runs this test binary as the gateway daemon (TestMain) in gw
// with cfg, the paths and mapping of lab.start.
func (l *lab) startSelf(t testing.TB, cfg Config) {
	t.Helper()
	cfg.Intercept, cfg.EIDPrefix, cfg.Control = []string{"g0"}, netip.MustParsePrefix("10.77.0.0/24"), l.sock
	cfg.Paths = []Path{
		{Name: "wan1", Dev: "p1", EID: netip.MustParseAddr(gwEID1), RLOC: netip.MustParseAddr("192.168.71.1")},
		{Name: "wan2", Dev: "p2", EID: netip.MustParseAddr(gwEID2), RLOC: netip.MustParseAddr("192.168.72.1")},
	}
	cfg.Static = []Record{{EID: netip.MustParsePrefix("10.88.0.0/24"), Locators: []Locator{
		{Addr: netip.MustParseAddr("192.168.71.2"), Priority: 1, Weight: 100},
		{Addr: netip.MustParseAddr("192.168.72.2"), Priority: 1, Weight: 100}}}}
	cfg.ListenPort, cfg.FWMark, cfg.Table, cfg.RulePriority = DefaultListenPort, DefaultFWMark, DefaultTable, DefaultRulePriority
	cfg.Congestion, cfg.MaxPerClient = DefaultCongestion, DefaultMaxPerClient
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(l.bin, "netns-exec", l.gw, "--", self, "-test.run=^$")
	cmd.Env = append(os.Environ(), daemonEnv+"="+string(js))
	l.launch(t, cmd)
}

// answerProbes makes srv answer RLOC probes on both its locators with the
// xTR's own responder (xtr.ServeProbes), for the data center's prefix; it
// returns the responder and its sockets by locator.
func (l *lab) answerProbes(t testing.TB) (*xtr.Responder, map[netip.Addr]*net.UDPConn) {
	t.Helper()
	addrs := []netip.Addr{netip.MustParseAddr("192.168.71.2"), netip.MustParseAddr("192.168.72.2")}
	xc := xtr.Config{RLOCs: []xtr.RLOC{{Dev: "s1", Priority: 1, Weight: 100}, {Dev: "s2", Priority: 1, Weight: 100}},
		EIDPrefixes: []netip.Prefix{netip.MustParsePrefix("10.88.0.0/24")}, TTL: xtr.DefaultTTL}
	r := xtr.NewResponder(xc.Records(addrs), nil)
	socks := map[netip.Addr]*net.UDPConn{}
	for _, a := range addrs {
		var pc *net.UDPConn
		if err := netns.Do(l.srv, func() (err error) {
			pc, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, lisp.ControlPort)))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		socks[a] = pc
		go xtr.ServeProbes(pc, a, r, ratelog.New(nil, 5, time.Minute, nil))
	}
	return r, socks
}

// probePort finds the UDP port of the gateway's probe socket on rloc.
func (l *lab) probePort(t testing.TB, rloc string) netip.AddrPort {
	t.Helper()
	out := run(t, "ip", "netns", "exec", l.gw, "ss", "-uanH", "src", rloc)
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		/* "UNCONN 0 0 192.168.71.1%p1:41234 0.0.0.0:*" */
		local := f[3]
		if i := strings.LastIndex(local, ":"); i > 0 {
			host, port := local[:i], local[i+1:]
			host, _, _ = strings.Cut(host, "%")
			if ap, err := netip.ParseAddrPort(host + ":" + port); err == nil {
				return ap
			}
		}
	}
	t.Fatalf("no probe socket on %s in gw:\n%s", rloc, out)
	return netip.AddrPort{}
}

// forgedReply is a Map-Reply with the P bit and nonce for the data
// center's prefix.
func forgedReply(t testing.TB, nonce uint64) []byte {
	t.Helper()
	rep := lisp.MapReply{Nonce: nonce, Probe: true, Records: []lisp.Record{{EID: netip.MustParsePrefix("10.88.0.0/24"), TTL: time.Minute,
		Locators: []lisp.Locator{{Addr: netip.MustParseAddr("192.168.71.2"), Priority: 1, Weight: 100, Reachable: true}}}}}
	b, err := rep.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// pathStatus returns the named path's status now.
func (l *lab) pathStatus(t testing.TB, name string) (PathStatus, Reply) {
	t.Helper()
	r, err := Ask(l.sock, Request{Op: "status"})
	if err != nil {
		t.Fatalf("status: %v\n%s", err, l.logs)
	}
	for _, p := range r.Paths {
		if p.Name == name {
			return p, r
		}
	}
	t.Fatalf("no path %s in %+v", name, r.Paths)
	return PathStatus{}, r
}

// waitPathFor waits up to within for the named path to satisfy cond and
// returns how long it took.
func (l *lab) waitPathFor(t testing.TB, name string, within time.Duration, what string, cond func(PathStatus) bool) time.Duration {
	t.Helper()
	start := time.Now()
	testenv.Eventually(t, "path "+name+" "+what, within, func() error {
		if p, _ := l.pathStatus(t, name); !cond(p) {
			return testenv.WithLogs(fmt.Errorf("%+v", p), l.logs)
		}
		return nil
	})
	return time.Since(start)
}

func nftIn(t testing.TB, ns, script string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft in %s: %v: %s", ns, err, out)
	}
}

// The far side of wan1 fails while the gateway's link p1 stays up (srv
// drops everything arriving on s1): RLOC probing marks 192.168.71.2 down
// over wan1 within interval×(misses+1) plus slack, status shows wan1 down
// for "rloc probe", its subflow is closed and the download goes on over
// wan2; when the drop is removed one answered probe brings wan1 back and
// the same connection gets its wan1 subflow again; the download arrives
// whole.
func TestPrivilegedGatewayRLOCProbeNoticesAFarSideFailure(t *testing.T) {
	l := newLabPrefix(t, "rp", "20mbit")
	const interval, misses = 300 * time.Millisecond, 3
	blob := make([]byte, 48<<20)
	if _, err := rand.Read(blob); err != nil {
		t.Fatal(err)
	}
	l.serve(t, srvEID+":5201", true, blob)
	resp, socks := l.answerProbes(t)
	l.startSelf(t, Config{ProbeInterval: interval, ProbeMisses: misses})

	d := l.download(t, srvEID+":5201")
	d.waitBytes(t, 1<<20, l.logs)
	l.conn(t, srvEID+":5201", func(c ConnStatus) bool { return liveOn(c, "wan1") && liveOn(c, "wan2") })
	for _, n := range []string{"wan1", "wan2"} {
		l.waitPathFor(t, n, 5*time.Second, "answering probes", func(p PathStatus) bool {
			return p.Up && len(p.Probes) == 1 && p.Probes[0].Answered > 0
		})
	}

	nftIn(t, l.srv, "table ip rptest {\n chain in {\n  type filter hook prerouting priority raw;\n  iifname \"s1\" drop\n }\n}\n")
	cut := time.Now()
	bound := interval*(misses+1) + time.Second
	took := l.waitPathFor(t, "wan1", bound, "down for rloc probe", func(p PathStatus) bool { return !p.Up && p.Reason == "rloc probe" })
	t.Logf("wan1 marked down %v after its far side failed (interval %v, misses %d)", time.Since(cut), interval, misses)
	if took < interval*(misses-1) {
		t.Fatalf("wan1 down after %v: sooner than %d missed probes could say", took, misses)
	}
	h, err := netns.Handle(l.gw)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	p1, err := h.LinkByName("p1")
	if err != nil {
		t.Fatal(err)
	}
	if p1.Attrs().Flags&net.FlagUp == 0 || p1.Attrs().OperState.String() != "up" {
		t.Fatalf("p1 is not up (%v): the test must fail the far side only", p1.Attrs().OperState)
	}
	c := l.conn(t, srvEID+":5201", func(c ConnStatus) bool {
		for _, s := range c.Subflows {
			if s.Path == "wan1" && s.State == "closed: rloc probe" {
				return liveOn(c, "wan2")
			}
		}
		return false
	})
	if !c.Open {
		t.Fatalf("connection closed: %+v", c)
	}
	/* answers that must not bring wan1 back, sent from srv to the
	   gateway's probe socket over wan1 (only what arrives on s1 is
	   dropped): from the probed locator's control port with a nonce the
	   gateway did not send, and from another port of it */
	gwSock := l.probePort(t, "192.168.71.1")
	const forged = 5
	for i := range forged {
		if _, err := socks[netip.MustParseAddr("192.168.71.2")].WriteToUDPAddrPort(forgedReply(t, uint64(0xbad0+i)), gwSock); err != nil {
			t.Fatal(err)
		}
	}
	var other *net.UDPConn
	if err := netns.Do(l.srv, func() (err error) {
		other, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(192, 168, 71, 2)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.WriteToUDPAddrPort(forgedReply(t, 1), gwSock); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the forged answers counted", 5*time.Second, func() error {
		if _, r := l.pathStatus(t, "wan1"); r.Counters["probe_bad_nonce"] < forged || r.Counters["probe_bad_source"] != 1 {
			return fmt.Errorf("counters %v", r.Counters)
		}
		return nil
	})
	/* a new connection while wan1 is down is planned without its dead
	   locator: it connects over wan2 at once, not after the initial
	   attempt on wan1 that a path dead beyond the link costs without
	   probing */
	small := make([]byte, 128<<10)
	if _, err := rand.Read(small); err != nil {
		t.Fatal(err)
	}
	l.serve(t, srvEID+":5202", true, small)
	began := time.Now()
	l.download(t, srvEID+":5202").wait(t, small, l.logs)
	if took := time.Since(began); took >= initialAttempt {
		t.Fatalf("a new connection with wan1's locator down took %v: it tried wan1 first", took)
	}
	sc := l.conn(t, srvEID+":5202", func(c ConnStatus) bool { return !c.Open })
	for _, sf := range sc.Subflows {
		if sf.Path != "wan2" {
			t.Fatalf("the new connection has a subflow on %s: %+v", sf.Path, sc)
		}
	}
	/* the transfer goes on over wan2 while wan1 is down */
	at := d.got.Load()
	d.waitBytes(t, at+2<<20, l.logs)
	if p, _ := l.pathStatus(t, "wan1"); p.Up {
		t.Fatalf("wan1 came back while its far side still drops: %+v", p)
	}

	nftIn(t, l.srv, "delete table ip rptest\n")
	healed := time.Now()
	l.waitPathFor(t, "wan1", interval+time.Second, "up again", func(p PathStatus) bool { return p.Up && p.Reason == "" })
	t.Logf("wan1 up again %v after the drop was removed", time.Since(healed))
	l.conn(t, srvEID+":5201", func(c ConnStatus) bool { return c.Open && liveOn(c, "wan1") && liveOn(c, "wan2") })
	d.wait(t, blob, l.logs)

	_, r := l.pathStatus(t, "wan1")
	if r.Counters["rloc_down"] != 1 || r.Counters["rloc_up"] != 1 || r.Counters["subflows_closed_rloc_down"] != 1 ||
		r.Counters["path_down"] != 0 || r.Counters["dial_errors"] != 0 || r.Counters["probe_bad_nonce"] < forged || r.Counters["probe_bad_source"] != 1 {
		t.Fatalf("counters %v: want one rloc down and up, one subflow closed for it, no link change, only the forged answers bad", r.Counters)
	}
	if st := resp.Stats(); st.Answered == 0 || st.Refused != 0 || st.RateLimited != 0 {
		t.Fatalf("responder %+v", st)
	}
	l.stop(t)
}
