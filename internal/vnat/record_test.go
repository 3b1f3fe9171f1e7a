package vnat

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/testenv"
)

// testCgroup mounts cgroup2 privately, makes a child cgroup and moves the
// test process into it until the test ends (a socket belongs to the cgroup
// its creator was in).
func testCgroup(t *testing.T) string {
	t.Helper()
	mnt := t.TempDir()
	if err := unix.Mount("cgroup2", mnt, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		t.Fatalf("mount cgroup2: %v", err)
	}
	dir := filepath.Join(mnt, "onehop-vnat-test-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Where this process is now (cgroup v2 line "0::/path"), to go back.
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	home := mnt
	for _, line := range splitLines(string(self)) {
		if len(line) > 3 && line[:3] == "0::" {
			home = filepath.Join(mnt, line[3:])
		}
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(filepath.Join(home, "cgroup.procs"), pid, 0o644); err != nil {
			t.Errorf("move back to %s: %v", home, err)
		}
		if err := os.Remove(dir); err != nil {
			t.Error(err)
		}
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Error(err)
		}
	})
	return dir
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := range len(s) {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// dialPair opens a TCP connection inside the namespace from 10.9.0.254 to
// 10.9.0.1:port and returns both ends.
func dialPair(t *testing.T, n *testNS, port int) (client, server net.Conn) {
	t.Helper()
	var ln net.Listener
	if err := netns.Do(n.name, func() (err error) {
		ln, err = net.Listen("tcp4", "10.9.0.1:"+strconv.Itoa(port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := netns.Do(n.name, func() (err error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(10, 9, 0, 254)}}
		client, err = d.Dial("tcp4", ln.Addr().String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return client, server
}

func tupleOf(proto Proto, c net.Conn) Tuple {
	return Tuple{Proto: proto, Local: netip.MustParseAddrPort(c.LocalAddr().String()),
		Remote: netip.MustParseAddrPort(c.RemoteAddr().String())}
}

func findConn(cs []Conn, t Tuple) (Conn, bool) {
	for _, c := range cs {
		if Tuple(c.Virtual) == t {
			return c, true
		}
	}
	return Conn{}, false
}

func TestPrivilegedSockopsRecordsEstablishedTCPAndForgetsClosed(t *testing.T) {
	n := newTestNS(t)
	d := openIn(t, n, Options{})
	if err := d.AttachCgroup(testCgroup(t)); err != nil {
		t.Fatal(err)
	}
	client, server := dialPair(t, n, 6001)
	ct, st := tupleOf(TCP, client), tupleOf(TCP, server)
	var cs []Conn
	testenv.Eventually(t, "both ends recorded", 3*time.Second, func() bool {
		var err error
		if cs, err = d.Connections(); err != nil {
			t.Fatal(err)
		}
		_, ok1 := findConn(cs, ct)
		_, ok2 := findConn(cs, st)
		return ok1 && ok2
	})
	for _, tu := range []Tuple{ct, st} {
		c, _ := findConn(cs, tu)
		if c.Source != "sockops" || c.State != StateActive || c.TCPState != "established" || c.Cookie == 0 || Tuple(c.Physical) != tu {
			t.Errorf("%s recorded as %+v", tu, c)
		}
	}
	client.Close()
	server.Close()
	testenv.Eventually(t, "both ends forgotten after close", 3*time.Second, func() bool {
		cs, err := d.Connections()
		if err != nil {
			t.Fatal(err)
		}
		_, ok1 := findConn(cs, ct)
		_, ok2 := findConn(cs, st)
		return !ok1 && !ok2
	})
	c, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c["conns_recorded"] != 2 || c["conns_closed"] != 2 {
		t.Errorf("counters %v: want 2 recorded, 2 closed", c)
	}
}

func TestPrivilegedPickUpFindsOpenTCPAndConnectedUDPInTheEndpointNamespace(t *testing.T) {
	n := newTestNS(t)
	client, server := dialPair(t, n, 6002)
	defer client.Close()
	defer server.Close()
	var connected, unconnected net.Conn
	if err := netns.Do(n.name, func() (err error) {
		if connected, err = net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 9, 0, 254)}, &net.UDPAddr{IP: net.IPv4(10, 9, 0, 1), Port: 6003}); err != nil {
			return err
		}
		unconnected, err = net.ListenUDP("udp4", &net.UDPAddr{Port: 6004})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer connected.Close()
	defer unconnected.Close()

	d := openIn(t, n, Options{}) // opened after: these were there before VNAT
	got, err := d.PickUp()
	if err != nil {
		t.Fatal(err)
	}
	cs, err := d.Connections()
	if err != nil {
		t.Fatal(err)
	}
	if got != 3 || len(cs) != 3 {
		t.Errorf("picked up %d, listed %+v: want the TCP connection's two ends and the connected UDP socket", got, cs)
	}
	for _, tu := range []Tuple{tupleOf(TCP, client), tupleOf(TCP, server), tupleOf(UDP, connected)} {
		c, ok := findConn(cs, tu)
		if !ok || c.Source != "sock_diag" || c.State != StateActive {
			t.Errorf("%s: %+v, found %v", tu, c, ok)
		}
	}
}
