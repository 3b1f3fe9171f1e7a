package vnatd

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// Two namespaces on a veth, `onehop vnat run` in each (the real binary, as
// the lab starts it), a TCP connection and a connected UDP pair between them; one end is
// re-addressed to another subnet with `ip addr` and nothing else (no
// suspend; the daemons keyed the connection at first contact and refuse
// unkeyed updates): its
// daemon notices, finds the peer's daemon, and both install the
// translation; the connection carries on. Then the other end moves too.
func TestPrivilegedDaemonsKeepATCPConnectionAcrossReaddressing(t *testing.T) {
	p := newPair(t, nil, nil)
	conn := dialEcho(t, p.nsB, p.nsA, "10.8.0.2:5001")
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
	// The daemons key the connection at first contact (keys are
	// required: the moves would be refused otherwise).
	waitStatus(t, p.a.sock, virtA, 10*time.Second, func(c ConnStatus) bool { return c.State == "active" && c.Keyed }, p.a.logs, p.b.logs)
	waitStatus(t, p.b.sock, virtB, 10*time.Second, func(c ConnStatus) bool { return c.State == "active" && c.Keyed }, p.a.logs, p.b.logs)

	// A connected UDP pair beside it (found by sock_diag, migrated alike).
	var ua, ub *net.UDPConn
	if err := netns.Do(p.nsA, func() (err error) {
		ua, err = net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 8, 0, 1)}, &net.UDPAddr{IP: net.IPv4(10, 8, 0, 2), Port: 5002})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ua.Close()
	if err := netns.Do(p.nsB, func() (err error) {
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
				t.Fatalf("udp %s: got %q, %v; want %q\n%s\n---\n%s", what, buf[:k], err, msg, p.a.logs, p.b.logs)
			}
		}
	}
	udpBothWays("before any move")
	uaV := ua.LocalAddr().String()
	udpA := uaV + "->10.8.0.2:5002"
	waitStatus(t, p.a.sock, udpA, 10*time.Second, func(c ConnStatus) bool { return c.Proto == "udp" && c.Keyed }, p.a.logs, p.b.logs)
	waitStatus(t, p.b.sock, "10.8.0.2:5002->"+uaV, 10*time.Second, func(c ConnStatus) bool { return c.Proto == "udp" && c.Keyed }, p.a.logs, p.b.logs)

	// b moves to 10.8.1.3: only `ip`; the daemons do the rest.
	p.moveB(t)
	waitStatus(t, p.b.sock, virtB, 10*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == "10.8.1.3:5001->"+aV
	}, p.a.logs, p.b.logs)
	waitStatus(t, p.a.sock, virtA, 10*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == aV+"->10.8.1.3:5001"
	}, p.a.logs, p.b.logs)
	for range 10 {
		if err := echo(5 * time.Second); err != nil {
			t.Fatalf("after b moved: %v\n%s\n---\n%s", err, p.a.logs, p.b.logs)
		}
	}
	waitStatus(t, p.a.sock, udpA, 10*time.Second, func(c ConnStatus) bool { return c.State == "migrated" }, p.a.logs, p.b.logs)
	udpBothWays("after b moved")

	// Then a moves to 10.8.2.4.
	netnstest.IP(t, p.nsA, "addr", "del", "10.8.0.1/24", "dev", "a0")
	netnstest.IP(t, p.nsA, "addr", "add", "10.8.2.4/24", "dev", "a0")
	netnstest.IP(t, p.nsA, "route", "replace", "10.8.1.0/24", "dev", "a0")
	netnstest.IP(t, p.nsB, "route", "add", "10.8.2.0/24", "dev", "b0")
	netnstest.IP(t, p.nsB, "neigh", "flush", "dev", "b0")
	aP := "10.8.2.4:" + aV[strings.LastIndexByte(aV, ':')+1:]
	waitStatus(t, p.a.sock, virtA, 10*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == aP+"->10.8.1.3:5001"
	}, p.a.logs, p.b.logs)
	waitStatus(t, p.b.sock, virtB, 10*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == "10.8.1.3:5001->"+aP
	}, p.a.logs, p.b.logs)
	for range 10 {
		if err := echo(5 * time.Second); err != nil {
			t.Fatalf("after both moved: %v\n%s\n---\n%s", err, p.a.logs, p.b.logs)
		}
	}
	waitStatus(t, p.a.sock, udpA, 10*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && strings.HasPrefix(c.Physical, "10.8.2.4:")
	}, p.a.logs, p.b.logs)
	udpBothWays("after both moved")
	// How long each restore took, from the daemons' own logs.
	for _, l := range []*testenv.Buffer{p.a.logs, p.b.logs} {
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
	p := newPair(t, nil, nil)
	go echoBytes(netnstest.Listen(t, p.nsB, "10.8.0.2:5001"))
	cs := p.dialMany(t, conns, "10.8.0.2:5001", 2*time.Second)
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
				t.Fatalf("%s: connection %d: %q, %v\n%s\n---\n%s", what, i, buf[:k], err, p.a.logs, p.b.logs)
			}
		}
	}
	ping("before the move")
	p.waitConns(t, "a keyed", p.a.sock, "active", "5001", conns, 20*time.Second)
	p.waitConns(t, "b keyed", p.b.sock, "active", "5001", conns, 20*time.Second)

	// The routes first this time, then the address.
	p.moveBRoutesFirst(t)
	p.waitConns(t, "b migrated", p.b.sock, "migrated", "5001", conns, 20*time.Second)
	p.waitConns(t, "a migrated", p.a.sock, "migrated", "5001", conns, 20*time.Second)
	ping("after the move")
	for _, line := range strings.Split(p.b.logs.String(), "\n") {
		if strings.Contains(line, `msg="vnat: restored"`) {
			t.Log(line)
		}
	}
}
