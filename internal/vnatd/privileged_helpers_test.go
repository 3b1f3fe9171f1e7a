package vnatd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/onehop/onehop/internal/netns/netnstest"
)

// The real daemons, a TCP connection from a to b, b's socket with
// aggressive keepalives (idle 1 s, interval 1 s, 2 probes) and b's
// application in a cgroup named by --freeze-cgroup. a suspends (`vnat
// suspend --all`) and is then unreachable for 10 s (a blackhole route for
// b in a). b's daemon made b secondary and started its helpers: b's
// egress answers b's keepalives and b's cgroup is frozen; the connection
// survives, and after a's `vnat resume` the helpers stop (thawed) and the
// connection carries data both ways. When b's daemon ends while a is away
// again, it thaws the application first. The control runs b with
// --keepalive-helper=false: b's kernel gives up (ETIMEDOUT).
func TestPrivilegedDaemonHelpersKeepAConnectionWhoseSuspendedPeerIsAway(t *testing.T) {
	for _, helper := range []bool{false, true} {
		name := map[bool]string{false: "keepalive helper off: reset", true: "helpers on: survives"}[helper]
		t.Run(name, func(t *testing.T) { daemonHelpers(t, helper) })
	}
}

func daemonHelpers(t *testing.T, helper bool) {
	cg, _ := testCgroup(t)
	argsB := []string{"--freeze-cgroup", cg, "--metrics-addr", "127.0.0.1:9431"}
	if !helper {
		argsB = append(argsB, "--keepalive-helper=false")
	}
	p := newPair(t, nil, argsB)
	ln := netnstest.Listen(t, p.nsB, "10.8.0.2:5001")
	ca := netnstest.Dial(t, p.nsA, nil, "10.8.0.2:5001", 2*time.Second)
	cb, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	if err := cb.(*net.TCPConn).SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: time.Second, Count: 2}); err != nil {
		t.Fatal(err)
	}
	line := func(from, to net.Conn, msg string) error {
		if _, err := from.Write([]byte(msg)); err != nil {
			return err
		}
		if err := to.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			return err
		}
		buf := make([]byte, 64)
		k, err := to.Read(buf)
		if err != nil {
			return err
		}
		if string(buf[:k]) != msg {
			return fmt.Errorf("read %q, want %q", buf[:k], msg)
		}
		return nil
	}
	if err := line(ca, cb, "before"); err != nil {
		t.Fatal(err)
	}
	virtB := cb.LocalAddr().String() + "->" + cb.RemoteAddr().String()
	virtA := ca.LocalAddr().String() + "->" + ca.RemoteAddr().String()
	waitStatus(t, p.b.sock, virtB, 10*time.Second, func(c ConnStatus) bool { return c.State == "active" }, p.a.logs, p.b.logs)
	if frozen(t, cg) {
		t.Fatal("the application is frozen before any suspend")
	}

	r, err := Ask(p.a.sock, Request{Op: "suspend", All: true})
	if err != nil || r.Count != 1 {
		t.Fatalf("suspend: %+v, %v\n%s\n---\n%s", r, err, p.a.logs, p.b.logs)
	}
	waitStatus(t, p.b.sock, virtB, 5*time.Second, func(c ConnStatus) bool {
		return c.State == "suspended" && c.Role == "secondary" && c.Helper
	}, p.a.logs, p.b.logs)
	waitFrozen(t, cg, true)

	netnstest.IP(t, p.nsA, "route", "add", "blackhole", "10.8.0.2/32")
	away := time.Now()
	if err := cb.SetReadDeadline(away.Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	_, err = cb.Read(make([]byte, 64))
	if !helper {
		if !errors.Is(err, syscall.ETIMEDOUT) {
			t.Fatalf("keepalive helper off: b's read ended with %v after %v; want ETIMEDOUT", err, time.Since(away))
		}
		return
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("helpers on: b's read ended with %v after %v; want the 10 s deadline\n%s", err, time.Since(away), p.b.logs)
	}
	// b's metrics say what its helper did.
	fams := scrapeIn(t, p.nsB, "127.0.0.1:9431")
	if v := value(t, fams, "onehop_vnat_keepalives_answered_total", dto.MetricType_COUNTER, nil); v < 5 {
		t.Errorf("b's metrics: %v keepalives answered in 10 s, want at least 5", v)
	}
	if v := value(t, fams, "onehop_vnat_connections", dto.MetricType_GAUGE, map[string]string{"state": "suspended"}); v != 1 {
		t.Errorf("b's metrics: %v connections suspended, want 1", v)
	}
	netnstest.IP(t, p.nsA, "route", "del", "blackhole", "10.8.0.2/32")
	if r, err := Ask(p.a.sock, Request{Op: "resume"}); err != nil || r.Count != 1 {
		t.Fatalf("resume: %+v, %v\n%s\n---\n%s", r, err, p.a.logs, p.b.logs)
	}
	waitStatus(t, p.b.sock, virtB, 10*time.Second, func(c ConnStatus) bool { return c.State == "migrated" && !c.Helper }, p.a.logs, p.b.logs)
	waitStatus(t, p.a.sock, virtA, 10*time.Second, func(c ConnStatus) bool { return c.State == "migrated" }, p.a.logs, p.b.logs)
	waitFrozen(t, cg, false)
	if err := line(ca, cb, "after"); err != nil {
		t.Fatalf("a to b after the outage: %v", err)
	}
	if err := line(cb, ca, "after, back"); err != nil {
		t.Fatalf("b to a after the outage: %v", err)
	}
	st, err := Ask(p.b.sock, Request{Op: "status"})
	if err != nil {
		t.Fatal(err)
	}
	if st.Counters["helpers_started"] != 1 || st.Counters["helpers_stopped"] != 1 {
		t.Errorf("b's counters %v: want one helper start and one stop", st.Counters)
	}

	// Away again, and b's daemon ends: it thaws the application first.
	if r, err := Ask(p.a.sock, Request{Op: "suspend", All: true}); err != nil || r.Count != 1 {
		t.Fatalf("second suspend: %+v, %v", r, err)
	}
	waitFrozen(t, cg, true)
	p.b.term(t)
	if frozen(t, cg) {
		t.Errorf("b's daemon ended and left the application frozen:\n%s", p.b.logs)
	}
}
