package vnatd

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns/netnstest"
)

// a moves to an address where its connection's port is taken: before the
// move a second connection runs from NEW:P to the same peer (P being the
// first connection's port). The real daemons restore the first from
// another port at NEW (the peer learns it from VNAT_UPD's L_Phys_Port),
// and both connections carry on, neither taking the other's packets.
func TestPrivilegedMovedConnectionTravelsFromAnotherPortWhenItsOwnIsTaken(t *testing.T) {
	p := newPair(t, nil, nil)
	c1 := dialEcho(t, p.nsB, p.nsA, "10.8.0.2:5001")
	r1 := bufio.NewReader(c1)
	if err := echoOnce(c1, r1, "c1 before"); err != nil {
		t.Fatal(err)
	}
	aV := c1.LocalAddr().String()
	port := aV[strings.LastIndexByte(aV, ':')+1:]
	virtA, virtB := p.waitKeyed(t, c1)

	// The new address, and a connection from it on the same port.
	netnstest.IP(t, p.nsA, "addr", "add", "10.8.2.4/24", "dev", "a0")
	netnstest.IP(t, p.nsB, "route", "add", "10.8.2.0/24", "dev", "b0")
	portN, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	c2 := netnstest.Dial(t, p.nsA, &net.TCPAddr{IP: net.IPv4(10, 8, 2, 4), Port: portN}, "10.8.0.2:5001", 2*time.Second)
	r2 := bufio.NewReader(c2)
	if err := echoOnce(c2, r2, "c2 before"); err != nil {
		t.Fatal(err)
	}

	// a leaves 10.8.0.1: 10.8.2.4 is its address now.
	netnstest.IP(t, p.nsA, "addr", "del", "10.8.0.1/24", "dev", "a0")
	netnstest.IP(t, p.nsA, "route", "add", "10.8.0.0/24", "dev", "a0")
	var phys string
	st := waitStatus(t, p.a.sock, virtA, 15*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && strings.HasPrefix(c.Physical, "10.8.2.4:")
	}, p.a.logs, p.b.logs)
	phys = st.Physical
	if strings.HasPrefix(phys, "10.8.2.4:"+port+"->") {
		t.Fatalf("a's connection travels as %s: the port is %s's already\n%s", phys, c2.LocalAddr(), p.a.logs)
	}
	newA := strings.TrimSuffix(phys, "->10.8.0.2:5001")
	waitStatus(t, p.b.sock, virtB, 10*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == "10.8.0.2:5001->"+newA
	}, p.a.logs, p.b.logs)
	for i := range 10 {
		if err := echoOnce(c1, r1, fmt.Sprintf("c1 after %d", i)); err != nil {
			t.Fatalf("moved connection after the move: %v\n%s\n---\n%s", err, p.a.logs, p.b.logs)
		}
		if err := echoOnce(c2, r2, fmt.Sprintf("c2 after %d", i)); err != nil {
			t.Fatalf("the connection at the new address after the move: %v\n%s\n---\n%s", err, p.a.logs, p.b.logs)
		}
	}
	t.Logf("a's connection %s travels as %s; %s kept its port", virtA, phys, c2.LocalAddr())
}
