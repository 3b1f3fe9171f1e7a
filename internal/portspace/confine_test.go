package portspace

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

func TestLostPortsAreWhatTheNewLeasesNoLongerCover(t *testing.T) {
	for _, c := range []struct {
		name     string
		old, now []Lease
		want     []Lease
	}{
		{"unchanged", []Lease{{0, 100, 199}}, []Lease{{0, 100, 199}}, nil},
		{"grown", []Lease{{0, 100, 199}}, []Lease{{0, 50, 299}}, nil},
		{"top cut", []Lease{{0, 100, 199}}, []Lease{{0, 100, 149}}, []Lease{{0, 150, 199}}},
		{"bottom cut", []Lease{{0, 100, 199}}, []Lease{{0, 150, 199}}, []Lease{{0, 100, 149}}},
		{"middle kept", []Lease{{0, 100, 199}}, []Lease{{0, 120, 129}}, []Lease{{0, 100, 119}, {0, 130, 199}}},
		{"moved away", []Lease{{0, 100, 199}}, []Lease{{0, 300, 399}}, []Lease{{0, 100, 199}}},
		{"other uplink does not cover", []Lease{{0, 100, 199}}, []Lease{{1, 100, 199}}, []Lease{{0, 100, 199}}},
		{"all gone", []Lease{{0, 1, 1}, {1, 65535, 65535}}, nil, []Lease{{0, 1, 1}, {1, 65535, 65535}}},
		{"top of the port space", []Lease{{0, 65000, 65535}}, []Lease{{0, 65000, 65534}}, []Lease{{0, 65535, 65535}}},
		{"two pieces cover it", []Lease{{0, 100, 199}}, []Lease{{0, 100, 149}, {0, 150, 199}}, nil},
	} {
		if got := LostPorts(c.old, c.now); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: LostPorts(%v, %v) = %v, want %v", c.name, c.old, c.now, got, c.want)
		}
	}
}

func TestEphemeralRangeIsTheFirstLease(t *testing.T) {
	lo, hi := EphemeralOf([]Lease{{1, 500, 599}, {0, 300, 399}, {0, 100, 199}})
	if lo != 100 || hi != 199 {
		t.Fatalf("EphemeralOf = %d-%d, want 100-199 (uplink 0's lowest)", lo, hi)
	}
}

// A sliver namespace beside a "host" namespace, joined by a veth whose
// host end is s0-NAME; the host end carries the shared address too, as an
// uplink would.
type confineLab struct {
	host, sliver string
	addr         netip.Addr
	mac          net.HardwareAddr
	vifIndex     int
}

func newConfineLab(t *testing.T) *confineLab {
	testenv.RequireRoot(t, "namespaces and sysctls")
	testenv.RequireTool(t, "nsenter", "ss")
	l := &confineLab{host: netnstest.New(t, "pst-h"), sliver: netnstest.New(t, "pst-s"),
		addr: netip.MustParseAddr("192.0.2.10"), mac: net.HardwareAddr{0x02, 0xaa, 0, 0, 0, 0x10}}
	hh, err := netns.Handle(l.host)
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	sfd, err := netns.Fd(l.sliver)
	if err != nil {
		t.Fatal(err)
	}
	defer sfd.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "s0-t"}, PeerName: "eth0", PeerHardwareAddr: l.mac, PeerNamespace: netlink.NsFd(int(sfd))}
	if err := hh.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	vif, err := hh.LinkByName("s0-t")
	if err != nil {
		t.Fatal(err)
	}
	l.vifIndex = vif.Attrs().Index
	self := &netlink.Addr{IPNet: &net.IPNet{IP: l.addr.AsSlice(), Mask: net.CIDRMask(24, 32)}}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// The host's own address sits on its lo here (no uplink in this test):
	// what matters is that it is local on both sides.
	hlo, err := hh.LinkByName("lo")
	must(err)
	must(hh.LinkSetUp(hlo))
	must(hh.AddrAdd(hlo, &netlink.Addr{IPNet: &net.IPNet{IP: l.addr.AsSlice(), Mask: net.CIDRMask(32, 32)}}))
	must(hh.LinkSetUp(vif))
	sh, err := netns.Handle(l.sliver)
	must(err)
	defer sh.Close()
	eth0, err := sh.LinkByName("eth0")
	must(err)
	must(sh.AddrAdd(eth0, self))
	must(sh.LinkSetUp(eth0))
	slo, err := sh.LinkByName("lo")
	must(err)
	must(sh.LinkSetUp(slo))
	return l
}

func (l *confineLab) plan(leases ...Lease) Plan {
	return Plan{
		Uplinks: []Uplink{{Index: 0, Name: "uplink0", Addr: l.addr, MAC: l.mac}},
		Slivers: []Sliver{{Name: "t", Slot: 1, Vifs: []Vif{{Uplink: 0, Name: "s0-t", Ifindex: l.vifIndex}}, Leases: leases}},
	}
}

// apply runs the confiner from inside the host namespace, where an agent
// runs.
func (l *confineLab) apply(t *testing.T, c *Confiner, p Plan) {
	t.Helper()
	if err := netns.Do(l.host, func() error { return c.Apply(p) }); err != nil {
		t.Fatal(err)
	}
}

func readSysctlIn(t *testing.T, ns, key string) string {
	t.Helper()
	var v string
	if err := netns.Do(ns, func() error {
		b, err := os.ReadFile("/proc/sys/" + key)
		v = strings.Join(strings.Fields(string(b)), " ")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// udpListener listens on addr:port inside ns and reports what it receives.
func udpListener(t *testing.T, ns string, addr netip.Addr, port uint16) <-chan string {
	t.Helper()
	got := make(chan string, 4)
	var conn *net.UDPConn
	if err := netns.Do(ns, func() error {
		var err error
		conn, err = net.ListenUDP("udp4", &net.UDPAddr{IP: addr.AsSlice(), Port: int(port)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			got <- string(buf[:n])
		}
	}()
	return got
}

func sendUDP(t *testing.T, ns string, to netip.Addr, port uint16, msg string) {
	t.Helper()
	if err := netns.Do(ns, func() error {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: to.AsSlice(), Port: int(port)})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(msg))
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, ch <-chan string, want, where string) {
	t.Helper()
	select {
	case got := <-ch:
		if got != want {
			t.Fatalf("%s got %q, want %q", where, got, want)
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("%s got nothing in 3 s, want %q", where, want)
	}
}

func nothing(t *testing.T, ch <-chan string, where string) {
	t.Helper()
	select {
	case got := <-ch:
		t.Fatalf("%s got %q, want nothing", where, got)
	case <-time.After(300 * time.Millisecond):
	}
}

func TestPrivilegedConfinerSetsTheLeaseAsEphemeralRangeAndSendsForeignPortsOfTheOwnAddressToTheHost(t *testing.T) {
	l := newConfineLab(t)
	c := NewConfiner(slog.New(slog.NewTextHandler(io.Discard, nil)))
	l.apply(t, c, l.plan(Lease{Uplink: 0, Lo: 10000, Hi: 10099}))

	if got := readSysctlIn(t, l.sliver, "net/ipv4/ip_local_port_range"); got != "10000 10099" {
		t.Errorf("sliver's ip_local_port_range = %q, want the lease 10000 10099", got)
	}
	if got := readSysctlIn(t, l.host, "net/ipv4/conf/s0-t/accept_local"); got != "1" {
		t.Errorf("host side accept_local = %q, want 1 (hairpin packets carry the host's own source)", got)
	}

	// A port the sliver does not lease: the datagram leaves through its
	// link and the host's stack (the host's own port) takes it; the
	// sliver's own listener on that port must not.
	hostGot := udpListener(t, l.host, l.addr, 5000)
	sliverGot5000 := udpListener(t, l.sliver, l.addr, 5000)
	sendUDP(t, l.sliver, l.addr, 5000, "to the host")
	waitFor(t, hostGot, "to the host", "the host's listener on 5000")
	nothing(t, sliverGot5000, "the sliver's own listener on 5000 (not its lease)")

	// A port it leases stays inside the sliver.
	own := udpListener(t, l.sliver, l.addr, 10005)
	hostGot10005 := udpListener(t, l.host, l.addr, 10005)
	sendUDP(t, l.sliver, l.addr, 10005, "to myself")
	waitFor(t, own, "to myself", "the sliver's listener on its leased 10005")
	nothing(t, hostGot10005, "the host's listener on 10005")

	// Applying the same plan again changes nothing and fails nothing.
	l.apply(t, c, l.plan(Lease{Uplink: 0, Lo: 10000, Hi: 10099}))
}

func TestPrivilegedShrunkLeaseCutsTheConnectionsOnLostPortsOnly(t *testing.T) {
	l := newConfineLab(t)
	c := NewConfiner(slog.New(slog.NewTextHandler(io.Discard, nil)))
	l.apply(t, c, l.plan(Lease{Uplink: 0, Lo: 10000, Hi: 10099}))

	// Two connections inside the sliver, one on a port it keeps (10010)
	// and one on a port it is about to lose (10090).
	type pair struct{ client, server net.Conn }
	// Both ends are explicit: the namespace's ephemeral range is the
	// lease, and a picked port could fall in the part it loses.
	dial := func(port, clientPort int) pair {
		var p pair
		if err := netns.Do(l.sliver, func() error {
			ln, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				return err
			}
			defer ln.Close()
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: clientPort}}
			if p.client, err = d.Dial("tcp4", ln.Addr().String()); err != nil {
				return err
			}
			p.server, err = ln.Accept()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.client.Close(); p.server.Close() })
		return p
	}
	kept, lost := dial(10010, 10011), dial(10090, 10012)

	l.apply(t, c, l.plan(Lease{Uplink: 0, Lo: 10000, Hi: 10049}))

	if n := c.Cut()["t"]; n == 0 {
		t.Fatalf("Cut()[t] = 0 after the lease lost 10050-10099 with a connection on 10090")
	}
	readErr := func(conn net.Conn) error {
		conn.SetReadDeadline(time.Now().Add(time.Second))
		_, err := conn.Read(make([]byte, 1))
		return err
	}
	if err := readErr(lost.server); err == nil || !(strings.Contains(err.Error(), "abort") || strings.Contains(err.Error(), "reset")) {
		t.Errorf("the connection on lost port 10090: read = %v, want it aborted or reset", err)
	}
	if _, err := kept.client.Write([]byte("x")); err != nil {
		t.Fatalf("write on the kept connection: %v", err)
	}
	if err := readErr(kept.server); err != nil {
		t.Errorf("the connection on kept port 10010: read = %v, want the byte", err)
	}
	if got := readSysctlIn(t, l.sliver, "net/ipv4/ip_local_port_range"); got != "10000 10049" {
		t.Errorf("ip_local_port_range = %q after the change, want 10000 10049", got)
	}
}
