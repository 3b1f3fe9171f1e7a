package vnatd

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns"
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
	nsA, nsB, sockA, sockB, logA, logB := p.nsA, p.nsB, p.a.sock, p.b.sock, p.a.logs, p.b.logs
	nsC := "vnatd-c-" + strings.TrimPrefix(nsA, "vnatd-a-")
	if err := netns.Create(nsC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netns.Delete(nsC); err != nil {
			t.Error(err)
		}
	})
	if out, err := exec.Command("ip", "link", "add", "c0", "netns", nsC, "type", "veth", "peer", "name", "b1", "netns", nsB).CombinedOutput(); err != nil {
		t.Fatalf("veth c0-b1: %v: %s", err, out)
	}
	ipIn(t, nsC, "addr", "add", "10.8.5.2/24", "dev", "c0")
	ipIn(t, nsB, "addr", "add", "10.8.5.1/24", "dev", "b1")
	ipIn(t, nsC, "link", "set", "c0", "up")
	ipIn(t, nsB, "link", "set", "b1", "up")
	ipIn(t, nsC, "route", "add", "10.8.0.0/24", "via", "10.8.5.1")

	var ln net.Listener
	if err := netns.Do(nsB, func() (err error) {
		ln, err = net.Listen("tcp4", "10.8.0.2:5001")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
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
	var x net.Conn
	if err := netns.Do(nsA, func() (err error) {
		x, err = net.DialTimeout("tcp4", "10.8.0.2:5001", 2*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	xb := accept()
	go echoConn(xb)
	rx := bufio.NewReader(x)
	if err := echoOnce(x, rx, "x before"); err != nil {
		t.Fatal(err)
	}
	aV := x.LocalAddr().String()
	port, err := strconv.Atoi(aV[strings.LastIndexByte(aV, ':')+1:])
	if err != nil {
		t.Fatal(err)
	}
	virtA, virtB := aV+"->10.8.0.2:5001", "10.8.0.2:5001->"+aV
	waitStatus(t, sockA, virtA, 10*time.Second, func(c ConnStatus) bool { return c.Keyed }, logA, logB)
	waitStatus(t, sockB, virtB, 10*time.Second, func(c ConnStatus) bool { return c.Keyed }, logA, logB)

	// Y: c, from 10.8.5.2 on X's port, to b; b's application holds it.
	var y net.Conn
	if err := netns.Do(nsC, func() (err error) {
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(10, 8, 5, 2), Port: port}}
		y, err = d.Dial("tcp4", "10.8.0.2:5001")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer y.Close()
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
	waitStatus(t, sockB, virtY, 10*time.Second, func(c ConnStatus) bool { return c.State == "active" }, logA, logB)
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
	ipIn(t, nsC, "link", "del", "c0")
	ipIn(t, nsB, "route", "add", "10.8.5.0/24", "dev", "b0")
	ipIn(t, nsA, "addr", "del", "10.8.0.1/24", "dev", "a0")
	ipIn(t, nsA, "addr", "add", "10.8.5.2/24", "dev", "a0")
	ipIn(t, nsA, "route", "add", "10.8.0.0/24", "dev", "a0")
	moved := time.Now()
	physB := fmt.Sprintf("10.8.0.2:5001->10.8.5.2:%d", port)
	waitStatus(t, sockB, virtB, 15*time.Second, func(c ConnStatus) bool { return c.State == "migrated" && c.Physical == physB }, logA, logB)
	waitStatus(t, sockA, virtA, 10*time.Second, func(c ConnStatus) bool { return c.State == "migrated" }, logA, logB)

	// Y's socket at b was closed for real.
	select {
	case r := <-yRead:
		if !errors.Is(r.err, syscall.ECONNABORTED) {
			t.Fatalf("b's read on the preempted Y ended with %v after %v, want ECONNABORTED\n%s", r.err, r.at.Sub(moved), logB)
		}
		t.Logf("b's read on the preempted Y ended with %v %v after the move", r.err, r.at.Sub(moved).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatalf("b's read on the preempted Y still blocked %v after the move: its socket lingers\n%s", time.Since(moved), logB)
	}
	st, err := Ask(sockB, Request{Op: "status"})
	if err != nil {
		t.Fatal(err)
	}
	if st.Counters["preempted"] != 1 || st.Counters["preempted_closed"] != 1 {
		t.Errorf("b's counters %v: want one preempted, its socket closed", st.Counters)
	}
	// The winner carries on.
	for i := range 10 {
		if err := echoOnce(x, rx, fmt.Sprintf("x after %d", i)); err != nil {
			t.Fatalf("X after the move: %v\n%s\n---\n%s", err, logA, logB)
		}
	}
}
