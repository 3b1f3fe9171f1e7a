package gateway

import (
	"crypto/rand"
	"net/netip"
	"testing"

	"github.com/onehop/onehop/internal/lispdp"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
)

// newLISPLab is newLab with the data center behind a tunnel router: user --
// gw -- two shaped paths -- xtr (RLOCs 192.168.71.2, 192.168.72.2; the
// in-kernel LISP datapath) -- srv (10.88.0.10, the EID prefix 10.88.0.0/24).
// The xTR knows each gateway EID behind the gateway's RLOC on its own path
// (what the gateway's Map-Register tells a map-server) and has no native
// route back to the gateway's EIDs: a reply reaches the gateway only
// encapsulated.
func newLISPLab(t testing.TB, rate string) (*lab, *lispdp.Kernel) {
	t.Helper()
	l := newLab(t, "")
	/* the lab's srv becomes the xTR: the EIDs move to a server behind it */
	xtr := l.srv
	l.xtr, l.srv = xtr, netnstest.New(t, "gw-dc")
	netnstest.IP(t, xtr, "addr", "del", srvEID+"/32", "dev", "lo")
	netnstest.IP(t, xtr, "addr", "del", srvUnmapped+"/32", "dev", "lo")
	netnstest.IP(t, xtr, "route", "del", gwEID1)
	netnstest.IP(t, xtr, "route", "del", gwEID2)
	netnstest.Veth(t, "x0", xtr, "e0", l.srv)
	netnstest.IP(t, xtr, "addr", "add", "10.88.0.1/24", "dev", "x0")
	netnstest.IP(t, xtr, "route", "add", srvUnmapped, "via", srvEID)
	netnstest.IP(t, l.srv, "addr", "add", srvEID+"/24", "dev", "e0")
	netnstest.IP(t, l.srv, "addr", "add", srvUnmapped+"/32", "dev", "lo")
	netnstest.IP(t, l.srv, "route", "add", "default", "via", "10.88.0.1")
	netnstest.IP(t, l.srv, "mptcp", "limits", "set", "subflows", "8", "add_addr_accepted", "0")
	for k, v := range map[string]string{
		"net/ipv4/ip_forward": "1", "net/ipv4/conf/all/rp_filter": "0", "net/ipv4/conf/default/rp_filter": "0",
	} {
		if err := netns.WriteSysctl(xtr, k, v); err != nil {
			t.Fatal(err)
		}
	}
	if rate != "" {
		for _, x := range [][2]string{{l.gw, "p1"}, {l.gw, "p2"}, {xtr, "s1"}, {xtr, "s2"}} {
			run(t, "tc", "-n", x[0], "qdisc", "add", "dev", x[1], "root", "tbf", "rate", rate, "burst", "64kb", "latency", "20ms")
		}
	}
	dp, err := lispdp.Open(lispdp.Options{Netns: netns.Path(xtr)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dp.Close(); err != nil {
			t.Error(err)
		}
	})
	h, err := netns.Handle(xtr)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for i, p := range []struct{ dev, local, remote, eid string }{
		{"s1", "192.168.71.2", "192.168.71.1", gwEID1},
		{"s2", "192.168.72.2", "192.168.72.1", gwEID2},
	} {
		lk, err := h.LinkByName(p.dev)
		if err != nil {
			t.Fatal(err)
		}
		id := uint8(i + 1)
		if err := dp.SetPath(id, lispdp.Path{Ifindex: lk.Attrs().Index, LocalRLOC: netip.MustParseAddr(p.local), RemoteRLOC: netip.MustParseAddr(p.remote), MTU: lk.Attrs().MTU}); err != nil {
			t.Fatal(err)
		}
		if err := dp.SetEID(netip.PrefixFrom(netip.MustParseAddr(p.eid), 32), []lispdp.PathChoice{{ID: id, Priority: 1, Weight: 1}}); err != nil {
			t.Fatal(err)
		}
		// The gateway delivers everything the xTR sends it to its own
		// sockets: superpackets may cross whole (lispdp, GSO).
		if err := dp.AttachRLOCWith(p.dev, lispdp.RLOCOptions{WholeSuperpackets: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := dp.AttachEID("x0"); err != nil {
		t.Fatal(err)
	}
	return l, dp
}

func lispBytes(t testing.TB, l *lab) (rx1, rx2 uint64) {
	t.Helper()
	r, err := Ask(l.sock, Request{Op: "status"})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Paths) != 2 || r.Paths[0].LISP == nil || r.Paths[1].LISP == nil {
		t.Fatalf("status has no LISP counters per path: %+v", r.Paths)
	}
	return r.Paths[0].LISP.RxBytes, r.Paths[1].LISP.RxBytes
}

// The same download with the real LISP datapath on the gateway (--lisp)
// and on the xTR: each subflow is encapsulated on its own path both ways
// (the gateway's per-path decapsulation counters grow on both), the server
// sees two subflows, the transfer survives wan1's cut with its hash intact,
// and wan1 is used again when it returns.
func TestPrivilegedGatewayWithLISPEncapsulatesEachSubflowOnItsPath(t *testing.T) {
	l, xtr := newLISPLab(t, "100mbit")
	blob := make([]byte, 64<<20)
	if _, err := rand.Read(blob); err != nil {
		t.Fatal(err)
	}
	l.serve(t, srvEID+":5201", true, blob)
	l.start(t, "--lisp", "--map", "10.88.0.0/24=192.168.71.2,192.168.72.2")

	dest := srvEID + ":5201"
	d := l.download(t, dest)
	d.waitBytes(t, 6<<20, l.logs)
	l.conn(t, dest, func(c ConnStatus) bool { return liveOn(c, "wan1") && liveOn(c, "wan2") })
	if ss := l.srvSubflows(t, "5201"); ss[gwEID1] != 1 || ss[gwEID2] != 1 {
		t.Fatalf("server's MPTCP subflows by peer %v; want one from %s and one from %s", ss, gwEID1, gwEID2)
	}
	a1, a2 := lispBytes(t, l)
	d.waitBytes(t, 16<<20, l.logs)
	b1, b2 := lispBytes(t, l)
	if b1-a1 < 2<<20 || b2-a2 < 2<<20 {
		t.Fatalf("10 MiB downloaded but the gateway decapsulated %d and %d bytes on wan1 and wan2", b1-a1, b2-a2)
	}

	netnstest.IP(t, l.gw, "link", "set", "p1", "down")
	l.conn(t, dest, func(c ConnStatus) bool { return !liveOn(c, "wan1") && liveOn(c, "wan2") })
	a1, a2 = lispBytes(t, l)
	got := d.got.Load()
	d.waitBytes(t, got+8<<20, l.logs)
	b1, b2 = lispBytes(t, l)
	if b1 != a1 || b2-a2 < 4<<20 {
		t.Fatalf("wan1 down: 8 MiB more with %d bytes decapsulated on wan1 and %d on wan2; want 0 and all", b1-a1, b2-a2)
	}
	netnstest.IP(t, l.gw, "link", "set", "p1", "up")
	l.conn(t, dest, func(c ConnStatus) bool { return liveOn(c, "wan1") && liveOn(c, "wan2") })
	a1, _ = lispBytes(t, l)
	d.wait(t, blob, l.logs)
	b1, _ = lispBytes(t, l)
	if b1 == a1 {
		t.Fatalf("wan1 came back but carried nothing more")
	}
	st, err := xtr.PathStats()
	if err != nil {
		t.Fatal(err)
	}
	if st[1].TxBytes < 8<<20 || st[2].TxBytes < 8<<20 {
		t.Fatalf("xTR encapsulated %d and %d bytes on its paths: want both used", st[1].TxBytes, st[2].TxBytes)
	}
	t.Logf("xTR path stats %+v", st)
	l.stop(t)
}
