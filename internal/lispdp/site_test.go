package lispdp

import (
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// siteServers gives the pair's xTR (B) two server namespaces behind veths,
// as the lab's xTRs have: s1 with 10.2.1.2 behind bs1 (10.2.1.1), s2 with
// 10.2.2.2 behind bs2 (10.2.2.1), both routing back through B. It returns
// their namespaces.
func (p *pair) siteServers(t *testing.T) (s1, s2 string) {
	t.Helper()
	if err := netns.WriteSysctl(p.b, "net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	s1, s2 = netnstest.New(t, "lispdp-s1"), netnstest.New(t, "lispdp-s2")
	for _, s := range []struct{ ns, dev, net string }{{s1, "bs1", "10.2.1."}, {s2, "bs2", "10.2.2."}} {
		netnstest.Veth(t, s.dev, p.b, "eth0", s.ns)
		netnstest.IP(t, p.b, "addr", "add", s.net+"1/24", "dev", s.dev)
		netnstest.IP(t, s.ns, "addr", "add", s.net+"2/24", "dev", "eth0")
		netnstest.IP(t, s.ns, "route", "add", "default", "via", s.net+"1")
	}
	return s1, s2
}

// TestPrivilegedUploadSuperpacketsCrossTheXTRWholeToASiteNamespace: the
// gateway (A) sends its uploads' superpackets whole (RLOCOptions), and the
// xTR (B), on a kernel that keeps a decapsulated superpacket's tunnel GSO
// state, strips them whole for a server namespace behind a site veth
// attached with EIDOptions.WholeSuperpackets: 8 MiB reach s1's socket
// intact, as fewer decapsulations than segments (decap_local_gso), nothing
// dropped. The control is s2, behind a site veth attached without the
// option: the same upload's superpackets are dropped (drop_gso_decap), as
// before, and never reach s2's socket whole.
func TestPrivilegedUploadSuperpacketsCrossTheXTRWholeToASiteNamespace(t *testing.T) {
	p := newPair(t)
	s1, s2 := p.siteServers(t)
	gw := open(t, Options{Netns: netns.Path(p.a)})
	xtr := open(t, Options{Netns: netns.Path(p.b)})
	if gw.DecapsGSO() {
		t.Skip("this kernel decapsulates superpackets in place (BPF_F_ADJ_ROOM_DECAP_L4_UDP): sites need no option")
	}
	if err := gw.SetPath(1, p.lispPath(t, p.ha, p.hb, "a1", "b1", "192.0.2.1", "192.0.2.2")); err != nil {
		t.Fatal(err)
	}
	if err := xtr.SetPath(1, p.lispPath(t, p.hb, p.ha, "b1", "a1", "192.0.2.2", "192.0.2.1")); err != nil {
		t.Fatal(err)
	}
	if err := gw.AttachRLOCWith("a1", RLOCOptions{WholeSuperpackets: true}); err != nil {
		t.Fatal(err)
	}
	if err := xtr.AttachRLOC("b1"); err != nil {
		t.Fatal(err)
	}
	if err := xtr.AttachEIDWith("bs1", EIDOptions{WholeSuperpackets: true}); err != nil {
		t.Fatal(err)
	}
	if err := xtr.AttachEID("bs2"); err != nil {
		t.Fatal(err)
	}
	onePath(t, gw, xtr)

	x0, s0 := counters(t, xtr), pathStats(t, xtr)
	const n = 8 << 20
	exchange(t, p.a, s1, netip.MustParseAddrPort("10.1.0.11:0"), netip.MustParseAddrPort("10.2.1.2:5013"), n)
	wholeDecaps(t, "xtr, upload to s1", xtr, x0, s0, n)
	noDrops(t, "upload to s1", gw, xtr)

	// The control: s2's veth has no option, so the xTR must not take the
	// superpackets whole there. The upload cannot finish; it is only
	// watched until the drops show.
	ln := netnstest.Listen(t, s2, "10.2.2.2:5014")
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		k, _ := io.Copy(io.Discard, c)
		got <- k
	}()
	conn := netnstest.Dial(t, p.a, &net.TCPAddr{IP: net.IPv4(10, 1, 0, 11)}, "10.2.2.2:5014", 5*time.Second)
	go func() {
		buf := make([]byte, 1<<20)
		conn.SetWriteDeadline(time.Now().Add(20 * time.Second))
		for i := 0; i < 8; i++ {
			if _, err := conn.Write(buf); err != nil {
				return
			}
		}
	}()
	testenv.Eventually(t, "the xTR to drop superpackets for s2 (drop_gso_decap)", 10*time.Second, func() bool {
		return counterDelta(x0, counters(t, xtr))["drop_gso_decap"] > 0
	})
	conn.Close()
	t.Logf("s2 got %d bytes before the connection closed", <-got)
}

// TestPrivilegedWholeSuperpacketsSiteMustBeAVethIntoAnotherNamespace: the
// option is refused, naming the interface, on a device that is no veth and
// on a veth whose peer is in the xTR's own namespace (the xTR would only
// route the packet on).
func TestPrivilegedWholeSuperpacketsSiteMustBeAVethIntoAnotherNamespace(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces and BPF")
	ns := netnstest.New(t, "lispdp-site")
	netnstest.Veth(t, "here0", ns, "here1", ns)
	d := open(t, Options{Netns: netns.Path(ns)})
	for dev, want := range map[string]string{
		"lo":    "lispdp: lo: whole superpackets: a device, want a veth",
		"here0": "lispdp: here0: whole superpackets: its veth peer is in this namespace",
	} {
		err := d.AttachEIDWith(dev, EIDOptions{WholeSuperpackets: true})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("AttachEIDWith(%s): %v, want an error with %q", dev, err, want)
		}
	}
	// The control: without the option the same veth attaches.
	if err := d.AttachEID("here0"); err != nil {
		t.Errorf("AttachEID(here0): %v", err)
	}
}
