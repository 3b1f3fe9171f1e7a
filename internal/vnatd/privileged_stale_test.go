package vnatd

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// The real daemons, both ends moved at once with a stale record at the
// location server (a third daemon). Three namespaces on one bridge (in the
// server's), all in 10.8.0.0/16 so a move needs no route. b moves once
// (10.8.0.2 → 10.8.1.3): migrated, and b's location client stores that at
// the server. Then b moves again (→ 10.8.3.5) while it can reach nobody
// (blackhole routes: its walk retries), and a moves (10.8.0.1 → 10.8.2.4):
// a's walk finds b at 10.8.1.3 in the server's stale record, and its
// update there goes nowhere. a falls back: it stores its location at the
// server and waits (status suspended, stale_locations 1). When b's
// routes come back, b's walk finds a at the server; both are migrated and
// the connection echoes. Before the fix a stayed locating with its restore
// failed (`update 1 connections at 10.8.1.3: dial ... i/o timeout`).
func TestPrivilegedBothEndsMoveWithAStaleLocationRecord(t *testing.T) {
	p := bridged(t)
	nsA, nsB := p.nsA, p.nsB
	sockA, sockB, logA, logB := p.a.sock, p.b.sock, p.a.logs, p.b.logs

	conn := dialEcho(t, nsB, nsA, "10.8.0.2:5001")
	next := numberedEcho(conn)
	echo := func(what string) {
		t.Helper()
		for range 10 {
			if err := next(what); err != nil {
				t.Fatalf("%s: %v\n%s\n---\n%s", what, err, logA, logB)
			}
		}
	}
	echo("before any move")
	aV := conn.LocalAddr().String()
	aPort := aV[strings.LastIndexByte(aV, ':')+1:]
	virtA, virtB := p.virtual(conn)
	waitStatus(t, sockA, virtA, 10*time.Second, func(c ConnStatus) bool { return c.State == "active" && c.Keyed }, logA, logB)
	waitStatus(t, sockB, virtB, 10*time.Second, func(c ConnStatus) bool { return c.State == "active" && c.Keyed }, logA, logB)

	// b moves once; its location client stores where it is at the server.
	netnstest.IP(t, nsB, "addr", "del", "10.8.0.2/16", "dev", "b0")
	netnstest.IP(t, nsB, "addr", "add", "10.8.1.3/16", "dev", "b0")
	waitStatus(t, sockA, virtA, 10*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == aV+"->10.8.1.3:5001"
	}, logA, logB)
	echo("after b moved")
	testenv.Eventually(t, "b's location client to store its location at the server", 10*time.Second, func() error {
		st, err := Ask(sockB, Request{Op: "status"})
		if err == nil && st.Counters["locations_stored"] < 1 {
			err = fmt.Errorf("counters %v", st.Counters)
		}
		return testenv.WithLogs(err, logB)
	})

	// b moves again but reaches nobody yet; a moves.
	for _, dst := range []string{"10.8.0.1/32", "10.8.2.4/32", "10.8.9.1/32"} {
		netnstest.IP(t, nsB, "route", "add", "blackhole", dst)
	}
	netnstest.IP(t, nsB, "addr", "del", "10.8.1.3/16", "dev", "b0")
	netnstest.IP(t, nsB, "addr", "add", "10.8.3.5/16", "dev", "b0")
	waitStatus(t, sockB, virtB, 5*time.Second, func(c ConnStatus) bool { return c.State == "locating" }, logA, logB)
	netnstest.IP(t, nsA, "addr", "del", "10.8.0.1/16", "dev", "a0")
	netnstest.IP(t, nsA, "addr", "add", "10.8.2.4/16", "dev", "a0")
	aP := "10.8.2.4:" + aPort
	waitStatus(t, sockA, virtA, 10*time.Second, func(c ConnStatus) bool {
		return c.State == "suspended" && c.Physical == aP+"->10.8.1.3:5001"
	}, logA, logB)
	if st, err := Ask(sockA, Request{Op: "status"}); err != nil || st.Counters["stale_locations"] != 1 || st.Counters["aborted"] != 0 {
		t.Fatalf("a's counters %+v, %v: want one stale location, nothing aborted\n%s", st.Counters, err, logA)
	}

	// b's routes come back: its walk, still retrying, finds a at the server.
	for _, dst := range []string{"10.8.0.1/32", "10.8.2.4/32", "10.8.9.1/32"} {
		netnstest.IP(t, nsB, "route", "del", "blackhole", dst)
	}
	waitStatus(t, sockB, virtB, 15*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == "10.8.3.5:5001->"+aP
	}, logA, logB)
	waitStatus(t, sockA, virtA, 5*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == aP+"->10.8.3.5:5001"
	}, logA, logB)
	echo("after both moved at once")
}

// bridged is three namespaces on one bridge (in the third's), all in
// 10.8.0.0/16 so a move needs no route: a (10.8.0.1) and b (10.8.0.2)
// with their daemons, which have the third's daemon (10.8.9.1) as their
// location server.
func bridged(t *testing.T) *pair {
	t.Helper()
	testenv.RequireRoot(t, "network namespaces and BPF")
	testenv.RequireTool(t, "ip", "go")
	nsA, nsB, nsS := netnstest.New(t, "vwalk-a"), netnstest.New(t, "vwalk-b"), netnstest.New(t, "vwalk-s")
	netnstest.Veth(t, "a0", nsA, "sa", nsS)
	netnstest.Veth(t, "b0", nsB, "sb", nsS)
	netnstest.IP(t, nsS, "link", "add", "br0", "type", "bridge")
	for _, port := range []string{"sa", "sb"} {
		netnstest.IP(t, nsS, "link", "set", port, "master", "br0")
	}
	netnstest.IP(t, nsS, "addr", "add", "10.8.9.1/16", "dev", "br0")
	netnstest.IP(t, nsS, "link", "set", "br0", "up")
	netnstest.IP(t, nsA, "addr", "add", "10.8.0.1/16", "dev", "a0")
	netnstest.IP(t, nsB, "addr", "add", "10.8.0.2/16", "dev", "b0")

	p := &pair{nsA: nsA, nsB: nsB, bin: netnstest.Onehop(t), dir: t.TempDir()}
	server := []string{"--location-server", "10.8.9.1"}
	p.a = &daemonProc{ns: nsA, iface: "a0", args: server, sock: filepath.Join(p.dir, nsA+".sock"), logs: &testenv.Buffer{}}
	p.b = &daemonProc{ns: nsB, iface: "b0", args: server, sock: filepath.Join(p.dir, nsB+".sock"), logs: &testenv.Buffer{}}
	s := &daemonProc{ns: nsS, iface: "br0", sock: filepath.Join(p.dir, nsS+".sock"), logs: &testenv.Buffer{}}
	p.start(t, s)
	p.start(t, p.a)
	p.start(t, p.b)
	return p
}

// The flake's mechanism with the real daemons: a moves (10.8.0.1 →
// 10.8.2.4) while b, which never moves, cannot be reached for VCMP from
// a's new place for a moment (nftables in a drops what a sends to b's
// port 2031: a SYN lost while the new place's route or mapping is not
// ready); the location server is reached and stores a's location. a's
// walk ends "stored only" and a waits suspended. Before the fix it stayed
// so, its own end translated, and b reset the connection at a's next
// segment. Now, once the drop is gone, a's next walk finds b: both are
// migrated and the same connection echoes. The drop's counter shows the
// drop was live.
func TestPrivilegedAPeerUnreachedForAMomentAfterTheMoveIsStillFound(t *testing.T) {
	testenv.RequireTool(t, "nft")
	p := bridged(t)
	c, echo := p.keyedEcho(t)
	virtA, virtB := p.virtual(c)
	port := localPort(c)
	inNS(t, p.nsA, `table ip onehop {
	chain out {
		type filter hook output priority filter; policy accept;
		ip daddr 10.8.0.2 tcp dport 2031 counter drop
	}
}
`, "nft", "-f", "-")
	netnstest.IP(t, p.nsA, "addr", "del", "10.8.0.1/16", "dev", "a0")
	netnstest.IP(t, p.nsA, "addr", "add", "10.8.2.4/16", "dev", "a0")
	waitStatus(t, p.a.sock, virtA, 15*time.Second, func(s ConnStatus) bool { return s.State == "suspended" }, p.a.logs, p.b.logs)
	out, err := exec.Command("ip", "netns", "exec", p.nsA, "nft", "list", "chain", "ip", "onehop", "out").CombinedOutput()
	if err != nil || !regexp.MustCompile(`counter packets [1-9]`).Match(out) {
		t.Fatalf("the drop of a's VCMP to b counted nothing (%v):\n%s", err, out)
	}
	inNS(t, p.nsA, "", "nft", "delete", "table", "ip", "onehop")
	p.waitMigrated(t, virtA, virtB, "10.8.2.4"+port, "10.8.0.2:5001", 15*time.Second)
	for range 5 {
		if err := echo("after a moved"); err != nil {
			t.Fatalf("echo after a moved: %v\n%s\n---\n%s", err, p.a.logs, p.b.logs)
		}
	}
}
