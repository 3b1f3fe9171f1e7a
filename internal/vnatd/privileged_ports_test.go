package vnatd

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns"
)

// echoLines serves ln: every connection echoes its lines.
func echoLines(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go echoConn(c)
	}
}

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

// dialEcho listens at addr in serverNS, where every connection echoes its
// lines, and dials it from clientNS; both are closed when t ends.
func dialEcho(t *testing.T, serverNS, clientNS, addr string) net.Conn {
	t.Helper()
	var ln net.Listener
	if err := netns.Do(serverNS, func() (err error) {
		ln, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go echoLines(ln)
	var conn net.Conn
	if err := netns.Do(clientNS, func() (err error) {
		conn, err = net.DialTimeout("tcp4", addr, 2*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
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

// a moves to an address where its connection's port is taken: before the
// move a second connection runs from NEW:P to the same peer (P being the
// first connection's port). The real daemons restore the first from
// another port at NEW (the peer learns it from VNAT_UPD's L_Phys_Port),
// and both connections carry on, neither taking the other's packets.
func TestPrivilegedMovedConnectionTravelsFromAnotherPortWhenItsOwnIsTaken(t *testing.T) {
	nsA, nsB, sockA, sockB, logA, logB := pairOfDaemons(t)
	var ln net.Listener
	if err := netns.Do(nsB, func() (err error) {
		ln, err = net.Listen("tcp4", "10.8.0.2:5001")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go echoLines(ln)
	var c1 net.Conn
	if err := netns.Do(nsA, func() (err error) {
		c1, err = net.DialTimeout("tcp4", "10.8.0.2:5001", 2*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	r1 := bufio.NewReader(c1)
	if err := echoOnce(c1, r1, "c1 before"); err != nil {
		t.Fatal(err)
	}
	aV := c1.LocalAddr().String()
	port := aV[strings.LastIndexByte(aV, ':')+1:]
	virtA, virtB := aV+"->10.8.0.2:5001", "10.8.0.2:5001->"+aV
	waitStatus(t, sockA, virtA, 10*time.Second, func(c ConnStatus) bool { return c.Keyed }, logA, logB)
	waitStatus(t, sockB, virtB, 10*time.Second, func(c ConnStatus) bool { return c.Keyed }, logA, logB)

	// The new address, and a connection from it on the same port.
	ipIn(t, nsA, "addr", "add", "10.8.2.4/24", "dev", "a0")
	ipIn(t, nsB, "route", "add", "10.8.2.0/24", "dev", "b0")
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	var c2 net.Conn
	if err := netns.Do(nsA, func() (err error) {
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(10, 8, 2, 4), Port: p}}
		c2, err = d.Dial("tcp4", "10.8.0.2:5001")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	r2 := bufio.NewReader(c2)
	if err := echoOnce(c2, r2, "c2 before"); err != nil {
		t.Fatal(err)
	}

	// a leaves 10.8.0.1: 10.8.2.4 is its address now.
	ipIn(t, nsA, "addr", "del", "10.8.0.1/24", "dev", "a0")
	ipIn(t, nsA, "route", "add", "10.8.0.0/24", "dev", "a0")
	var phys string
	st := waitStatus(t, sockA, virtA, 15*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && strings.HasPrefix(c.Physical, "10.8.2.4:")
	}, logA, logB)
	phys = st.Physical
	if strings.HasPrefix(phys, "10.8.2.4:"+port+"->") {
		t.Fatalf("a's connection travels as %s: the port is %s's already\n%s", phys, c2.LocalAddr(), logA)
	}
	newA := strings.TrimSuffix(phys, "->10.8.0.2:5001")
	waitStatus(t, sockB, virtB, 10*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == "10.8.0.2:5001->"+newA
	}, logA, logB)
	for i := range 10 {
		if err := echoOnce(c1, r1, fmt.Sprintf("c1 after %d", i)); err != nil {
			t.Fatalf("moved connection after the move: %v\n%s\n---\n%s", err, logA, logB)
		}
		if err := echoOnce(c2, r2, fmt.Sprintf("c2 after %d", i)); err != nil {
			t.Fatalf("the connection at the new address after the move: %v\n%s\n---\n%s", err, logA, logB)
		}
	}
	t.Logf("a's connection %s travels as %s; %s kept its port", virtA, phys, c2.LocalAddr())
}
