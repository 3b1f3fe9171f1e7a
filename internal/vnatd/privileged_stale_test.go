package vnatd

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns"
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
	testenv.RequireRoot(t, "network namespaces and BPF")
	testenv.RequireTool(t, "ip", "go")
	suffix := make([]byte, 3)
	if _, err := rand.Read(suffix); err != nil {
		t.Fatal(err)
	}
	x := hex.EncodeToString(suffix)
	nsA, nsB, nsS := "vwalk-a-"+x, "vwalk-b-"+x, "vwalk-s-"+x
	for _, n := range []string{nsA, nsB, nsS} {
		if err := netns.Create(n); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := netns.Delete(n); err != nil {
				t.Error(err)
			}
		})
	}
	for _, l := range [][3]string{{"a0", nsA, "sa"}, {"b0", nsB, "sb"}} {
		if out, err := exec.Command("ip", "link", "add", l[0], "netns", l[1], "type", "veth", "peer", "name", l[2], "netns", nsS).CombinedOutput(); err != nil {
			t.Fatalf("veth %s: %v: %s", l[0], err, out)
		}
	}
	ipIn(t, nsS, "link", "add", "br0", "type", "bridge")
	for _, p := range []string{"sa", "sb"} {
		ipIn(t, nsS, "link", "set", p, "master", "br0")
		ipIn(t, nsS, "link", "set", p, "up")
	}
	ipIn(t, nsS, "addr", "add", "10.8.9.1/16", "dev", "br0")
	ipIn(t, nsS, "link", "set", "br0", "up")
	ipIn(t, nsA, "addr", "add", "10.8.0.1/16", "dev", "a0")
	ipIn(t, nsA, "link", "set", "a0", "up")
	ipIn(t, nsB, "addr", "add", "10.8.0.2/16", "dev", "b0")
	ipIn(t, nsB, "link", "set", "b0", "up")

	p := &pair{nsA: nsA, nsB: nsB, dir: t.TempDir()}
	p.bin = filepath.Join(p.dir, "onehop")
	if out, err := exec.Command("go", "build", "-o", p.bin, "../../cmd/onehop").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	server := []string{"--location-server", "10.8.9.1"}
	p.a = &daemonProc{ns: nsA, iface: "a0", args: server, sock: filepath.Join(p.dir, nsA+".sock"), logs: &syncBuf{}}
	p.b = &daemonProc{ns: nsB, iface: "b0", args: server, sock: filepath.Join(p.dir, nsB+".sock"), logs: &syncBuf{}}
	s := &daemonProc{ns: nsS, iface: "br0", sock: filepath.Join(p.dir, nsS+".sock"), logs: &syncBuf{}}
	p.start(t, s)
	p.start(t, p.a)
	p.start(t, p.b)
	sockA, sockB, logA, logB := p.a.sock, p.b.sock, p.a.logs, p.b.logs

	conn := dialEcho(t, nsB, nsA, "10.8.0.2:5001")
	r := bufio.NewReader(conn)
	seq := 0
	echo := func(what string) {
		t.Helper()
		for range 10 {
			seq++
			msg := fmt.Sprintf("line %d\n", seq)
			if err := conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Write([]byte(msg)); err != nil {
				t.Fatalf("%s: %v\n%s\n---\n%s", what, err, logA, logB)
			}
			got, err := r.ReadString('\n')
			if err != nil || got != msg {
				t.Fatalf("%s: echo %q, %v; want %q\n%s\n---\n%s", what, got, err, msg, logA, logB)
			}
		}
	}
	echo("before any move")
	aV := conn.LocalAddr().String()
	aPort := aV[strings.LastIndexByte(aV, ':')+1:]
	virtA, virtB := aV+"->10.8.0.2:5001", "10.8.0.2:5001->"+aV
	waitStatus(t, sockA, virtA, 10*time.Second, func(c ConnStatus) bool { return c.State == "active" && c.Keyed }, logA, logB)
	waitStatus(t, sockB, virtB, 10*time.Second, func(c ConnStatus) bool { return c.State == "active" && c.Keyed }, logA, logB)

	// b moves once; its location client stores where it is at the server.
	ipIn(t, nsB, "addr", "del", "10.8.0.2/16", "dev", "b0")
	ipIn(t, nsB, "addr", "add", "10.8.1.3/16", "dev", "b0")
	waitStatus(t, sockA, virtA, 10*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == aV+"->10.8.1.3:5001"
	}, logA, logB)
	echo("after b moved")
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := Ask(sockB, Request{Op: "status"})
		if err == nil && st.Counters["locations_stored"] >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b's location client stored nothing in 10 s: %+v, %v\n%s", st.Counters, err, logB)
		}
		time.Sleep(50 * time.Millisecond) // the daemon's counters: polled
	}

	// b moves again but reaches nobody yet; a moves.
	for _, dst := range []string{"10.8.0.1/32", "10.8.2.4/32", "10.8.9.1/32"} {
		ipIn(t, nsB, "route", "add", "blackhole", dst)
	}
	ipIn(t, nsB, "addr", "del", "10.8.1.3/16", "dev", "b0")
	ipIn(t, nsB, "addr", "add", "10.8.3.5/16", "dev", "b0")
	waitStatus(t, sockB, virtB, 5*time.Second, func(c ConnStatus) bool { return c.State == "locating" }, logA, logB)
	ipIn(t, nsA, "addr", "del", "10.8.0.1/16", "dev", "a0")
	ipIn(t, nsA, "addr", "add", "10.8.2.4/16", "dev", "a0")
	aP := "10.8.2.4:" + aPort
	waitStatus(t, sockA, virtA, 10*time.Second, func(c ConnStatus) bool {
		return c.State == "suspended" && c.Physical == aP+"->10.8.1.3:5001"
	}, logA, logB)
	if st, err := Ask(sockA, Request{Op: "status"}); err != nil || st.Counters["stale_locations"] != 1 || st.Counters["aborted"] != 0 {
		t.Fatalf("a's counters %+v, %v: want one stale location, nothing aborted\n%s", st.Counters, err, logA)
	}

	// b's routes come back: its walk, still retrying, finds a at the server.
	for _, dst := range []string{"10.8.0.1/32", "10.8.2.4/32", "10.8.9.1/32"} {
		ipIn(t, nsB, "route", "del", "blackhole", dst)
	}
	waitStatus(t, sockB, virtB, 15*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == "10.8.3.5:5001->"+aP
	}, logA, logB)
	waitStatus(t, sockA, virtA, 5*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == aP+"->10.8.3.5:5001"
	}, logA, logB)
	echo("after both moved at once")
	for _, l := range []*syncBuf{logA, logB} {
		for _, line := range strings.Split(l.String(), "\n") {
			if strings.Contains(line, "msg=\"vnat: restored\"") || strings.Contains(line, "stale record") {
				t.Log(line)
			}
		}
	}
}
