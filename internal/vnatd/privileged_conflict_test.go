package vnatd

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns/netnstest"
)

// A virtual-identification conflict (paper §3.4.2) resolved by preempting,
// with the real daemons. b serves 10.8.0.2:5001 and runs `--conflict
// preempt`. X runs from a (10.8.0.1:P). Y runs from a third host c at
// 10.8.5.2:P, reaching b on another link. c then leaves the network (its
// link is deleted; b's socket for Y stays), and a moves to 10.8.5.2: X's
// tuple at b becomes Y's. b's daemon preempts Y, and closes Y's socket: the
// read b's application has blocked on Y fails with ECONNABORTED within a
// few seconds of the move, while X is migrated and keeps echoing. Before
// the daemon closed preempted sockets, that read only hit its deadline.
func TestPrivilegedPreemptedConnectionsSocketIsClosedAndTheWinnerKeepsEchoing(t *testing.T) {
	p := newPair(t, nil, []string{"--conflict", "preempt"})
	nsC := netnstest.New(t, "vnatd-c")
	netnstest.Veth(t, "c0", nsC, "b1", p.nsB)
	netnstest.IP(t, nsC, "addr", "add", "10.8.5.2/24", "dev", "c0")
	netnstest.IP(t, p.nsB, "addr", "add", "10.8.5.1/24", "dev", "b1")
	netnstest.IP(t, nsC, "route", "add", "10.8.0.0/24", "via", "10.8.5.1")

	ln := netnstest.Listen(t, p.nsB, "10.8.0.2:5001")
	accept := func() net.Conn {
		t.Helper()
		if err := ln.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	// X: a to b, echoed by b.
	x := netnstest.Dial(t, p.nsA, nil, "10.8.0.2:5001", 2*time.Second)
	xb := accept()
	go echoConn(xb)
	rx := bufio.NewReader(x)
	if err := echoOnce(x, rx, "x before"); err != nil {
		t.Fatal(err)
	}
	port := x.LocalAddr().(*net.TCPAddr).Port
	virtA, virtB := p.waitKeyed(t, x)

	// Y: c, from 10.8.5.2 on X's port, to b; b's application holds it.
	y := netnstest.Dial(t, nsC, &net.TCPAddr{IP: net.IPv4(10, 8, 5, 2), Port: port}, "10.8.0.2:5001", 2*time.Second)
	yb := accept()
	virtY := fmt.Sprintf("10.8.0.2:5001->10.8.5.2:%d", port)
	if yb.RemoteAddr().String() != fmt.Sprintf("10.8.5.2:%d", port) {
		t.Fatalf("b accepted %s, want Y from 10.8.5.2:%d", yb.RemoteAddr(), port)
	}
	if _, err := y.Write([]byte("y\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(yb).ReadString('\n'); err != nil || line != "y\n" {
		t.Fatalf("Y at b read %q, %v", line, err)
	}
	waitStatus(t, p.b.sock, virtY, 10*time.Second, func(c ConnStatus) bool { return c.State == "active" }, p.a.logs, p.b.logs)
	// b's application waits on Y.
	type result struct {
		err error
		at  time.Time
	}
	yRead := make(chan result, 1)
	if err := yb.SetReadDeadline(time.Now().Add(40 * time.Second)); err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := yb.Read(make([]byte, 16))
		yRead <- result{err, time.Now()}
	}()

	// c leaves; a moves to c's address.
	netnstest.IP(t, nsC, "link", "del", "c0")
	netnstest.IP(t, p.nsB, "route", "add", "10.8.5.0/24", "dev", "b0")
	netnstest.IP(t, p.nsA, "addr", "del", "10.8.0.1/24", "dev", "a0")
	netnstest.IP(t, p.nsA, "addr", "add", "10.8.5.2/24", "dev", "a0")
	netnstest.IP(t, p.nsA, "route", "add", "10.8.0.0/24", "dev", "a0")
	moved := time.Now()
	physB := fmt.Sprintf("10.8.0.2:5001->10.8.5.2:%d", port)
	waitStatus(t, p.b.sock, virtB, 15*time.Second, func(c ConnStatus) bool { return c.State == "migrated" && c.Physical == physB }, p.a.logs, p.b.logs)
	waitStatus(t, p.a.sock, virtA, 10*time.Second, func(c ConnStatus) bool { return c.State == "migrated" }, p.a.logs, p.b.logs)

	// Y's socket at b was closed for real.
	select {
	case r := <-yRead:
		if !errors.Is(r.err, syscall.ECONNABORTED) {
			t.Fatalf("b's read on the preempted Y ended with %v after %v, want ECONNABORTED\n%s", r.err, r.at.Sub(moved), p.b.logs)
		}
		t.Logf("b's read on the preempted Y ended with %v %v after the move", r.err, r.at.Sub(moved).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatalf("b's read on the preempted Y still blocked %v after the move: its socket lingers\n%s", time.Since(moved), p.b.logs)
	}
	st, err := Ask(p.b.sock, Request{Op: "status"})
	if err != nil {
		t.Fatal(err)
	}
	if st.Counters["preempted"] != 1 || st.Counters["preempted_closed"] != 1 {
		t.Errorf("b's counters %v: want one preempted, its socket closed", st.Counters)
	}
	// The winner carries on.
	for i := range 10 {
		if err := echoOnce(x, rx, fmt.Sprintf("x after %d", i)); err != nil {
			t.Fatalf("X after the move: %v\n%s\n---\n%s", err, p.a.logs, p.b.logs)
		}
	}
}
