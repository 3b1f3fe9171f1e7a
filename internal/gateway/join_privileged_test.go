package gateway

import (
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// regexpCounter matches an nftables counter that counted something.
var regexpCounter = regexp.MustCompile(`counter packets [1-9]`)

// srvNFT loads an nftables script into srv (a table gwjoin of its own).
func (l *lab) srvNFT(t testing.TB, script string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", l.srv, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft in srv: %v: %s", err, out)
	}
}

// mptcpCounter reads one MPTcpExt counter in namespace ns.
func mptcpCounter(t testing.TB, ns, field string) uint64 {
	t.Helper()
	return netnstest.Netstat(t, ns, "MPTcpExt", field)
}

// missing is the reason status gives for conn's missing path, or "".
func missing(c ConnStatus, path string) string {
	for _, m := range c.Missing {
		if m.Path == path {
			return m.Reason
		}
	}
	return ""
}

// Issue 20 item 11. A server made MPTCP by `mptcpize run socat
// TCP-LISTEN:...` without fork closes its listening socket once it has
// accepted, so the gateway's MP_JOIN SYN (MPJoinSynTx on gw) finds nothing
// listening on srv and is answered with a plain reset before MPTCP sees it
// (MPJoinSynRx on srv does not move): status shows the connection with 1 of
// 2 paths and why. Controls: a native MPTCP server and socat with fork get
// both paths. A join that gets no answer (srv drops it) shows "no answer".
// A connection whose one established path dies while a join on the other
// was refused gets a subflow on the live path and its download completes;
// before the fix the gateway closed the last subflow and the download
// stalled.
func TestPrivilegedGatewayReportsMissingPathsAndMovesALastSubflow(t *testing.T) {
	testenv.RequireTool(t, "socat", "mptcpize")
	l := newLab(t, "20mbit")
	small := make([]byte, 6<<20)
	big := make([]byte, 24<<20)
	for _, b := range [][]byte{small, big} {
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(t.TempDir(), "small")
	if err := os.WriteFile(file, small, 0o644); err != nil {
		t.Fatal(err)
	}
	l.serve(t, srvEID+":5201", true, small)
	l.serve(t, srvEID+":5204", true, big)
	l.serve(t, srvEID+":5205", true, big)
	socat := func(port string, fork bool) {
		opts := "TCP-LISTEN:" + port + ",reuseaddr"
		if fork {
			opts += ",fork"
		}
		d := netnstest.Start(t, "socat", &testenv.Buffer{}, exec.Command("ip", "netns", "exec", l.srv, "mptcpize", "run", "socat", opts, "OPEN:"+file+",rdonly"))
		testenv.Eventually(t, "socat listening on "+port, 10*time.Second, func() error {
			out := run(t, "ip", "netns", "exec", l.srv, "ss", "-HMltn", "( sport = :"+port+" )")
			if !strings.Contains(out, ":"+port) {
				return testenv.WithLogs(fmt.Errorf("no MPTCP listener on %s: %q", port, out), d.Log)
			}
			return nil
		})
	}
	socat("5202", false)
	socat("5203", true)
	l.start(t)
	open := func(port string, cond func(ConnStatus) bool) ConnStatus {
		return l.conn(t, srvEID+":"+port, func(c ConnStatus) bool { return c.Open && cond(c) })
	}
	joins := func() (tx, rx uint64) {
		return mptcpCounter(t, l.gw, "MPJoinSynTx"), mptcpCounter(t, l.srv, "MPJoinSynRx")
	}

	// Controls: a native MPTCP server, then socat with fork, get both
	// paths, and srv receives the join.
	for _, port := range []string{"5201", "5203"} {
		tx0, rx0 := joins()
		d := l.download(t, srvEID+":"+port)
		c := open(port, func(c ConnStatus) bool { return c.EstablishedPaths == 2 })
		if c.PlannedPaths != 2 || len(c.Missing) != 0 {
			t.Fatalf("port %s: status %+v, want 2 of 2 paths", port, c)
		}
		d.wait(t, small, l.logs)
		if tx, rx := joins(); tx == tx0 || rx == rx0 {
			t.Fatalf("port %s: MPJoinSynTx on gw %d -> %d, MPJoinSynRx on srv %d -> %d: want both to move", port, tx0, tx, rx0, rx)
		}
	}

	// socat without fork: the join leaves gw and never reaches srv's MPTCP.
	tx0, rx0 := joins()
	d := l.download(t, srvEID+":5202")
	c := open("5202", func(c ConnStatus) bool { return strings.Contains(missing(c, "wan2"), "plain reset") })
	if c.PlannedPaths != 2 || c.EstablishedPaths != 1 || !liveOn(c, "wan1") {
		t.Fatalf("socat without fork: status %+v, want 1 of 2 paths, wan1's live", c)
	}
	d.wait(t, small, l.logs)
	if tx, rx := joins(); tx == tx0 || rx != rx0 {
		t.Fatalf("socat without fork: MPJoinSynTx on gw %d -> %d, MPJoinSynRx on srv %d -> %d: want the join sent and never received", tx0, tx, rx0, rx)
	}
	t.Logf("socat without fork: wan2 missing: %s", missing(c, "wan2"))

	// srv drops the join: no answer, said so; the SYNs did arrive (counted).
	l.srvNFT(t, "table ip gwjoin {\n chain in {\n  type filter hook prerouting priority raw;\n  ip saddr "+gwEID2+" tcp flags syn counter drop\n }\n}\n")
	d = l.download(t, srvEID+":5204")
	c = open("5204", func(c ConnStatus) bool { return strings.Contains(missing(c, "wan2"), "no answer") })
	if c.EstablishedPaths != 1 || !liveOn(c, "wan1") {
		t.Fatalf("join dropped: status %+v, want 1 of 2 paths", c)
	}
	if out := run(t, "ip", "netns", "exec", l.srv, "nft", "list", "table", "ip", "gwjoin"); !regexpCounter.MatchString(out) {
		t.Fatalf("srv's drop counted no join SYN:\n%s", out)
	}
	d.wait(t, big, l.logs)

	// The last path dies: the join on wan2 was refused (srv resets it);
	// srv then takes joins again and wan1 goes down under the download.
	l.srvNFT(t, "flush table ip gwjoin\ntable ip gwjoin {\n chain in {\n  type filter hook prerouting priority raw;\n  ip saddr "+gwEID2+" tcp flags syn counter reject with tcp reset\n }\n}\n")
	d = l.download(t, srvEID+":5205")
	c = open("5205", func(c ConnStatus) bool { return strings.Contains(missing(c, "wan2"), "refused") })
	d.waitBytes(t, 2<<20, l.logs)
	run(t, "ip", "netns", "exec", l.srv, "nft", "delete", "table", "ip", "gwjoin")
	_, p2 := l.rx(t)
	got := d.got.Load()
	run(t, "ip", "-n", l.gw, "link", "set", "p1", "down")
	l.waitPath(t, "wan1", false)
	c = open("5205", func(c ConnStatus) bool { return liveOn(c, "wan2") })
	d.wait(t, big, l.logs)
	_, p2end := l.rx(t)
	t.Logf("after wan1 died: %d of %d bytes left, wan2 received %d bytes", int64(len(big))-got, len(big), p2end-p2)
	if p2end-p2 < uint64(int64(len(big))-got) {
		t.Fatalf("after wan1 died wan2 received %d bytes; the download had %d left", p2end-p2, int64(len(big))-got)
	}
	r, err := Ask(l.sock, Request{Op: "status"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Counters["last_subflow_kept"] != 1 || r.Counters["subflows_closed_path_down"] != 1 {
		t.Fatalf("counters %v: want the last subflow kept once, then closed once wan2 joined", r.Counters)
	}
}
