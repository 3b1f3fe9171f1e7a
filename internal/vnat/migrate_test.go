package vnat

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// TestPrivilegedTCPConnectionSurvivesReaddressingWithTranslation runs a
// real TCP connection (and a connected UDP pair) between two namespaces, re-addresses one end, shows
// the connection stalls, installs the translation on both ends by hand
// (what VCMP will do) and shows it carries on; then moves the other end
// too. Checksum offload is off on both veths so every segment's checksum is
// computed in software after tc egress and verified by the receiver: a
// wrong CHECKSUM_PARTIAL fix-up would stall the connection.
func TestPrivilegedTCPConnectionSurvivesReaddressingWithTranslation(t *testing.T) {
	testenv.RequireTool(t, "ethtool", "ip")
	a, b := linkedNS(t, "10.8.0.1/24", "10.8.0.2/24")
	a.sh(t, "ethtool", "-K", "a0", "rx", "off", "tx", "off")
	b.sh(t, "ethtool", "-K", "b0", "rx", "off", "tx", "off")

	da := openIn(t, a, Options{})
	db := openIn(t, b, Options{})
	if err := da.AttachInterface("a0"); err != nil {
		t.Fatal(err)
	}
	if err := db.AttachInterface("b0"); err != nil {
		t.Fatal(err)
	}

	// Echo server in b, client in a.
	ln := netnstest.Listen(t, b.name, "10.8.0.2:5001")
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
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
	}()
	conn := netnstest.Dial(t, a.name, nil, "10.8.0.2:5001", 2*time.Second)
	r := bufio.NewReader(conn)
	seq := 0
	echo := func(timeout time.Duration) error {
		seq++
		msg := fmt.Sprintf("line %d %s\n", seq, "0123456789abcdef0123456789abcdef")
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
	dump := func() string {
		ca, _ := da.Counters()
		cb, _ := db.Counters()
		return fmt.Sprintf("a: %v\n%s%s%s\nb: %v\n%s%s%s", ca, a.sh(t, "ip", "route"), a.sh(t, "ip", "neigh"), a.sh(t, "nstat", "-az", "TcpInCsumErrors", "IpExtInNoRoutes", "TcpExtTCPTimeouts", "IpInAddrErrors"),
			cb, b.sh(t, "ip", "route"), b.sh(t, "ip", "neigh"), b.sh(t, "nstat", "-az", "TcpInCsumErrors", "IpInAddrErrors", "IpExtInNoRoutes", "TcpExtTCPTimeouts"))
	}
	for range 3 {
		if err := echo(2 * time.Second); err != nil {
			t.Fatalf("before any move: %v", err)
		}
	}
	clientPort := uint16(conn.LocalAddr().(*net.TCPAddr).Port)

	// A connected UDP pair beside it (paper §3.4.1: migrated like TCP).
	var ua, ub *net.UDPConn
	if err := netns.Do(a.name, func() (err error) {
		ua, err = net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 8, 0, 1)}, &net.UDPAddr{IP: net.IPv4(10, 8, 0, 2), Port: 5002})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ua.Close()
	if err := netns.Do(b.name, func() (err error) {
		ub, err = net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 8, 0, 2), Port: 5002}, ua.LocalAddr().(*net.UDPAddr))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ub.Close()
	uaV := netip.MustParseAddrPort(ua.LocalAddr().String())
	ubV := netip.MustParseAddrPort("10.8.0.2:5002")
	udpBothWays := func(what string) {
		t.Helper()
		for _, pair := range [][2]*net.UDPConn{{ua, ub}, {ub, ua}} {
			msg := fmt.Sprintf("%s from %s", what, pair[0].LocalAddr())
			if _, err := pair[0].Write([]byte(msg)); err != nil {
				t.Fatal(err)
			}
			if err := pair[1].SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 256)
			k, err := pair[1].Read(buf)
			if err != nil || string(buf[:k]) != msg {
				t.Fatalf("udp %s: got %q, %v; want %q", what, buf[:k], err, msg)
			}
		}
	}
	udpBothWays("before any move")
	aV := netip.AddrPortFrom(netip.MustParseAddr("10.8.0.1"), clientPort)
	bV := netip.MustParseAddrPort("10.8.0.2:5001")

	// b moves to 10.8.1.3 (another subnet): its old address leaves b0 and is kept on lo.
	// (Deleted first: deleting a primary address takes the secondaries of
	// its subnet with it unless promote_secondaries is set.)
	b.sh(t, "ip", "addr", "del", "10.8.0.2/24", "dev", "b0")
	b.sh(t, "ip", "addr", "add", "10.8.1.3/24", "dev", "b0")
	b.sh(t, "ip", "route", "add", "10.8.0.0/24", "dev", "b0") // the new subnet's router, in effect
	a.sh(t, "ip", "route", "add", "10.8.1.0/24", "dev", "a0")
	a.sh(t, "ip", "neigh", "flush", "dev", "a0") // the old location's MAC is gone with it
	if err := db.KeepLocal(bV.Addr(), "b0"); err != nil {
		t.Fatal(err)
	}
	// Without translation the connection stalls (the test can fail).
	if err := echo(700 * time.Millisecond); err == nil {
		t.Fatal("echo worked after the move with no translation: the move did not cut anything")
	}
	// The unanswered line is still in flight; it is echoed once the
	// translation is in (TCP retransmits it), so read it back first.
	bP := netip.MustParseAddrPort("10.8.1.3:5001")
	if err := da.Translate(Virtual{TCP, aV, bV}, Physical{TCP, aV, bP}); err != nil {
		t.Fatal(err)
	}
	if err := db.Translate(Virtual{TCP, bV, aV}, Physical{TCP, bP, aV}); err != nil {
		t.Fatal(err)
	}
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatalf("the line sent during the move never came back after translation: %v\n%s", err, dump())
	}
	for range 20 {
		if err := echo(2 * time.Second); err != nil {
			t.Fatalf("after b moved: %v", err)
		}
	}
	ubP := netip.MustParseAddrPort("10.8.1.3:5002")
	if err := da.Translate(Virtual{UDP, uaV, ubV}, Physical{UDP, uaV, ubP}); err != nil {
		t.Fatal(err)
	}
	if err := db.Translate(Virtual{UDP, ubV, uaV}, Physical{UDP, ubP, uaV}); err != nil {
		t.Fatal(err)
	}
	udpBothWays("after b moved")

	// Now a moves too, to 10.8.2.4.
	a.sh(t, "ip", "addr", "del", "10.8.0.1/24", "dev", "a0")
	a.sh(t, "ip", "addr", "add", "10.8.2.4/24", "dev", "a0")
	a.sh(t, "ip", "route", "replace", "10.8.1.0/24", "dev", "a0")
	b.sh(t, "ip", "route", "add", "10.8.2.0/24", "dev", "b0")
	b.sh(t, "ip", "neigh", "flush", "dev", "b0")
	if err := da.KeepLocal(aV.Addr(), "a0"); err != nil {
		t.Fatal(err)
	}
	aP := netip.AddrPortFrom(netip.MustParseAddr("10.8.2.4"), clientPort)
	if err := da.Translate(Virtual{TCP, aV, bV}, Physical{TCP, aP, bP}); err != nil {
		t.Fatal(err)
	}
	if err := db.Translate(Virtual{TCP, bV, aV}, Physical{TCP, bP, aP}); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if err := echo(3 * time.Second); err != nil {
			t.Fatalf("after both moved: %v\n%s", err, dump())
		}
	}
	uaP := netip.AddrPortFrom(netip.MustParseAddr("10.8.2.4"), uaV.Port())
	if err := da.Translate(Virtual{UDP, uaV, ubV}, Physical{UDP, uaP, ubP}); err != nil {
		t.Fatal(err)
	}
	if err := db.Translate(Virtual{UDP, ubV, uaV}, Physical{UDP, ubP, uaP}); err != nil {
		t.Fatal(err)
	}
	udpBothWays("after both moved")
	for _, d := range []*Kernel{da, db} {
		c, err := d.Counters()
		if err != nil {
			t.Fatal(err)
		}
		if c["egress_translated"] < 20 || c["ingress_translated"] < 20 || c["translate_errors"] != 0 {
			t.Errorf("counters %v: want at least 20 translations each way and no errors", c)
		}
	}
	// The old addresses are not announced: b answers no ARP for 10.8.0.2.
	out := b.sh(t, "sysctl", "-n", "net.ipv4.conf.b0.arp_ignore", "net.ipv4.conf.b0.arp_announce")
	if out != "1\n2\n" {
		t.Errorf("b0 arp_ignore/arp_announce = %q, want 1 and 2", out)
	}
}
