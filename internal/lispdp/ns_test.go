package lispdp

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// pair is two namespaces joined by two veth pairs, one per path:
// a1 192.0.2.1/30 - b1 192.0.2.2/30 and a2 192.0.2.5/30 - b2 192.0.2.6/30.
// A is the gateway (EIDs 10.1.0.11, 10.1.0.12), B the xTR with its server
// (EID 10.2.0.2) and a non-EID address 172.16.0.2.
type pair struct {
	a, b   string
	ha, hb *netlink.Handle
}

func newPair(t *testing.T) *pair {
	t.Helper()
	testenv.RequireRoot(t, "network namespaces and BPF")
	testenv.RequireTool(t, "ip", "ethtool")
	p := &pair{a: netnstest.New(t, "lispdp-a"), b: netnstest.New(t, "lispdp-b")}
	for _, n := range []string{p.a, p.b} {
		// Quiet links (no IPv6 chatter) and no reverse-path filter: path 2's
		// packets arrive on b2 while B's route to their source is via b1.
		for k, v := range map[string]string{
			"net/ipv6/conf/all/disable_ipv6": "1", "net/ipv6/conf/default/disable_ipv6": "1",
			"net/ipv4/conf/all/rp_filter": "0", "net/ipv4/conf/default/rp_filter": "0",
		} {
			if err := netns.WriteSysctl(n, k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	var err error
	if p.ha, err = netns.Handle(p.a); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.ha.Close)
	if p.hb, err = netns.Handle(p.b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.hb.Close)
	for _, l := range []struct{ a, b, aAddr, bAddr string }{
		{"a1", "b1", "192.0.2.1/30", "192.0.2.2/30"},
		{"a2", "b2", "192.0.2.5/30", "192.0.2.6/30"},
	} {
		netnstest.Veth(t, l.a, p.a, l.b, p.b)
		p.addr(t, p.ha, l.a, l.aAddr)
		p.addr(t, p.hb, l.b, l.bAddr)
	}
	p.addr(t, p.ha, "lo", "10.1.0.11/32")
	p.addr(t, p.ha, "lo", "10.1.0.12/32")
	p.addr(t, p.hb, "lo", "10.2.0.2/32")
	p.addr(t, p.hb, "lo", "172.16.0.2/32")
	// EIDs are routed towards path 1's next hop (so the kernel resolves a
	// neighbour and tc egress runs) with an MTU that leaves room for the
	// 36 bytes: TCP's MSS follows, both ways.
	p.route(t, p.ha, "a1", "10.2.0.0/16", "192.0.2.2", 1464)
	p.route(t, p.ha, "a1", "172.16.0.0/16", "192.0.2.2", 0)
	p.route(t, p.hb, "b1", "10.1.0.0/16", "192.0.2.1", 1464)
	return p
}

func (p *pair) addr(t *testing.T, h *netlink.Handle, ifname, cidr string) {
	t.Helper()
	l, err := h.LinkByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(l, a); err != nil {
		t.Fatalf("%s on %s: %v", cidr, ifname, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
}

func (p *pair) route(t *testing.T, h *netlink.Handle, ifname, dst, via string, mtu int) {
	t.Helper()
	l, err := h.LinkByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	_, n, err := net.ParseCIDR(dst)
	if err != nil {
		t.Fatal(err)
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: n, Gw: net.ParseIP(via), MTU: mtu}
	if err := h.RouteAdd(r); err != nil {
		t.Fatalf("route %s via %s: %v", dst, via, err)
	}
}

func (p *pair) sh(t *testing.T, ns string, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s in %s: %v: %s", strings.Join(args, " "), ns, err, out)
	}
}

func (p *pair) link(t *testing.T, h *netlink.Handle, ifname string) netlink.Link {
	t.Helper()
	l, err := h.LinkByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// txBytes is what ifname has sent so far.
func (p *pair) txBytes(t *testing.T, h *netlink.Handle, ifname string) uint64 {
	t.Helper()
	return p.link(t, h, ifname).Attrs().Statistics.TxBytes
}

// lispPath builds the path over ifname towards the peer interface.
func (p *pair) lispPath(t *testing.T, h, peerH *netlink.Handle, ifname, peer, local, remote string) Path {
	t.Helper()
	l, pl := p.link(t, h, ifname), p.link(t, peerH, peer)
	return Path{Ifindex: l.Attrs().Index, LocalRLOC: addr(local), RemoteRLOC: addr(remote),
		SrcMAC: l.Attrs().HardwareAddr, DstMAC: pl.Attrs().HardwareAddr, MTU: 1500}
}

// exchange sends n random bytes from src to dst over TCP, dialled from
// namespace ns; the server in B sends the same bytes back. Both ends check
// the content by hash.
func exchange(t *testing.T, ns, bns string, src, dst netip.AddrPort, n int) {
	t.Helper()
	ln := netnstest.Listen(t, bns, dst.String())
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		buf := make([]byte, n)
		if _, err := io.ReadFull(c, buf); err != nil {
			served <- fmt.Errorf("server read: %w", err)
			return
		}
		_, err = c.Write(buf)
		served <- err
	}()
	data := make([]byte, n)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	c := netnstest.Dial(t, ns, net.TCPAddrFromAddrPort(src), dst.String(), 5*time.Second)
	if err := c.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(data); err != nil {
		t.Fatalf("write: %v", err)
	}
	back := make([]byte, n)
	if _, err := io.ReadFull(c, back); err != nil {
		t.Fatalf("read back: %v", err)
	}
	if sha256.Sum256(back) != sha256.Sum256(data) || !bytes.Equal(back, data) {
		t.Fatal("content came back different")
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}

// lone sends one TCP segment of exactly the connection's MSS, on its own,
// from src (in namespace ns) to dst (in bns), and waits for the server to
// have it all.
func lone(t *testing.T, ns, bns string, src, dst netip.AddrPort) {
	t.Helper()
	ln := netnstest.Listen(t, bns, dst.String())
	got := make(chan error, 1)
	c := netnstest.Dial(t, ns, net.TCPAddrFromAddrPort(src), dst.String(), 5*time.Second)
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var mss int
	var serr error
	if err := rc.Control(func(fd uintptr) {
		mss, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG)
	}); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatalf("TCP_MAXSEG: %v", serr)
	}
	if mss != 1448 { // 1460 advertised, less 12 for timestamps: a 1500-byte packet
		t.Fatalf("MSS %d, want 1448: the segment would not be 1500 bytes", mss)
	}
	data := make([]byte, mss)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	go func() {
		s, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		defer s.Close()
		if err := s.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
			got <- err
			return
		}
		buf := make([]byte, len(data))
		if _, err := io.ReadFull(s, buf); err != nil {
			got <- fmt.Errorf("server read: %w", err)
			return
		}
		if !bytes.Equal(buf, data) {
			got <- fmt.Errorf("the segment arrived different")
			return
		}
		got <- nil
	}()
	if _, err := c.Write(data); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestPrivilegedSubflowsStayOnTheirPaths: a TCP flow from a source pinned to
// path 1 crosses a1/b1 only, its replies come back the same way (B picks
// the path by the destination EID, as registered by the gateway); a flow
// from the source pinned to path 2 crosses a2/b2 only; a flow to a
// destination outside every EID prefix passes natively, untouched. Real
// TCP with TSO on: superpackets are encapsulated whole and segmented by
// the kernel; content checked by hash.
func TestPrivilegedSubflowsStayOnTheirPaths(t *testing.T) {
	p := newPair(t)
	gw := open(t, Options{Netns: netns.Path(p.a)})
	xtr := open(t, Options{Netns: netns.Path(p.b)})
	for id, l := range map[uint8][4]string{1: {"a1", "b1", "192.0.2.1", "192.0.2.2"}, 2: {"a2", "b2", "192.0.2.5", "192.0.2.6"}} {
		gp := p.lispPath(t, p.ha, p.hb, l[0], l[1], l[2], l[3])
		if id == 2 {
			// The gateway's path 2 comes without MACs: the kernel resolves
			// its next hop (bpf_redirect_neigh).
			gp.SrcMAC, gp.DstMAC = nil, nil
		}
		if err := gw.SetPath(id, gp); err != nil {
			t.Fatal(err)
		}
		if err := xtr.SetPath(id, p.lispPath(t, p.hb, p.ha, l[1], l[0], l[3], l[2])); err != nil {
			t.Fatal(err)
		}
		if err := gw.AttachRLOC(l[0]); err != nil {
			t.Fatal(err)
		}
		if err := xtr.AttachRLOC(l[1]); err != nil {
			t.Fatal(err)
		}
	}
	// This kernel (6.18) cannot decapsulate tunnel superpackets in place,
	// so AttachRLOC had each interface segment them before they leave.
	t.Logf("kernel decapsulates GSO superpackets in place: %v", gw.DecapsGSO())
	if !gw.DecapsGSO() {
		for ns, l := range map[string]string{p.a: "a1", p.b: "b2"} {
			out, err := exec.Command("ip", "netns", "exec", ns, "ethtool", "-k", l).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "tx-udp_tnl-segmentation: off") {
				t.Errorf("%s still segments tunnels in hardware: %v: %s", l, err, out)
			}
		}
	}
	both := []PathChoice{{ID: 1, Priority: 1, Weight: 50}, {ID: 2, Priority: 1, Weight: 50}}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(gw.SetEID(netip.MustParsePrefix("10.2.0.0/16"), both))
	must(gw.PinSource(addr("10.1.0.11"), 1))
	must(gw.PinSource(addr("10.1.0.12"), 2))
	// What the gateway registers: each subflow EID behind its own RLOC.
	must(xtr.SetEID(netip.MustParsePrefix("10.1.0.0/16"), both))
	must(xtr.SetEID(netip.MustParsePrefix("10.1.0.11/32"), []PathChoice{{ID: 1, Priority: 1, Weight: 1}}))
	must(xtr.SetEID(netip.MustParsePrefix("10.1.0.12/32"), []PathChoice{{ID: 2, Priority: 1, Weight: 1}}))

	const n = 2 << 20
	for _, tc := range []struct {
		src       string
		on, off   uint8
		aOn, aOff string
		bOn, bOff string
	}{
		{"10.1.0.11", 1, 2, "a1", "a2", "b1", "b2"},
		{"10.1.0.12", 2, 1, "a2", "a1", "b2", "b1"},
	} {
		t.Run("from "+tc.src, func(t *testing.T) {
			gw0, xtr0 := pathStats(t, gw), pathStats(t, xtr)
			c0 := counters(t, gw)
			tx := map[string]uint64{}
			for _, l := range []string{tc.aOn, tc.aOff} {
				tx[l] = p.txBytes(t, p.ha, l)
			}
			for _, l := range []string{tc.bOn, tc.bOff} {
				tx[l] = p.txBytes(t, p.hb, l)
			}
			exchange(t, p.a, p.b, netip.AddrPortFrom(addr(tc.src), 0), netip.MustParseAddrPort("10.2.0.2:5001"), n)
			g, x := sub(pathStats(t, gw), gw0), sub(pathStats(t, xtr), xtr0)
			t.Logf("gateway %+v, xtr %+v", g, x)
			if g[tc.on].TxBytes < n || x[tc.on].RxBytes < n {
				t.Errorf("path %d carried %d/%d bytes up, want >= %d", tc.on, g[tc.on].TxBytes, x[tc.on].RxBytes, n)
			}
			if x[tc.on].TxBytes < n || g[tc.on].RxBytes < n {
				t.Errorf("path %d carried %d/%d bytes back, want >= %d", tc.on, x[tc.on].TxBytes, g[tc.on].RxBytes, n)
			}
			if g[tc.off] != (Stats{}) || x[tc.off] != (Stats{}) {
				t.Errorf("path %d used: gateway %+v, xtr %+v", tc.off, g[tc.off], x[tc.off])
			}
			// The links themselves: the other pair carried nothing of it
			// (a few ARP frames at most).
			onA, offA := p.txBytes(t, p.ha, tc.aOn)-tx[tc.aOn], p.txBytes(t, p.ha, tc.aOff)-tx[tc.aOff]
			onB, offB := p.txBytes(t, p.hb, tc.bOn)-tx[tc.bOn], p.txBytes(t, p.hb, tc.bOff)-tx[tc.bOff]
			t.Logf("link bytes sent: %s %d, %s %d, %s %d, %s %d", tc.aOn, onA, tc.aOff, offA, tc.bOn, onB, tc.bOff, offB)
			if onA < n || onB < n || offA > 1024 || offB > 1024 {
				t.Errorf("links: %s %d %s %d (want >= %d), %s %d %s %d (want <= 1024)", tc.aOn, onA, tc.bOn, onB, n, tc.aOff, offA, tc.bOff, offB)
			}
			c := counterDelta(c0, counters(t, gw))
			// TSO: encapsulated superpackets count once each but as their
			// segments in the path's packets.
			t.Logf("gateway counters %v; path %d sent %d segments in %d packets", c, tc.on, g[tc.on].TxPackets, c["encapsulated"])
			if c["encapsulated"] == 0 || c["encapsulated"] >= g[tc.on].TxPackets {
				t.Errorf("no GSO superpacket encapsulated: %d packets for %d segments", c["encapsulated"], g[tc.on].TxPackets)
			}
			if c["pinned"] != c["encapsulated"] {
				t.Errorf("%d of %d encapsulated packets pinned", c["pinned"], c["encapsulated"])
			}
			for _, d := range []*Kernel{gw, xtr} {
				drops, err := d.Drops()
				if err != nil {
					t.Fatal(err)
				}
				for r, v := range drops {
					if v != 0 {
						t.Errorf("dropped %d: %s", v, r)
					}
				}
			}
		})
	}

	t.Run("without a route MTU: TCP fits by GSO or learns the path MTU by ICMP, as a DF ping does", func(t *testing.T) {
		// 10.1.0.13 (pinned to path 1) and 10.2.0.3 are routed with the
		// links' MTU (1500) both ways: each end advertises MSS 1460.
		p.sh(t, p.b, "ip", "addr", "add", "10.2.0.3/32", "dev", "lo")
		p.addr(t, p.ha, "lo", "10.1.0.13/32")
		p.route(t, p.ha, "a1", "10.2.0.3/32", "192.0.2.2", 0)
		p.route(t, p.hb, "b1", "10.1.0.13/32", "192.0.2.1", 0)
		must(gw.PinSource(addr("10.1.0.13"), 1))
		must(xtr.SetEID(netip.MustParsePrefix("10.1.0.13/32"), []PathChoice{{ID: 1, Priority: 1, Weight: 1}}))
		learned := func(t *testing.T, ns, dst, src string) bool {
			t.Helper()
			out, err := exec.Command("ip", "netns", "exec", ns, "ip", "route", "get", dst, "from", src).CombinedOutput()
			if err != nil {
				t.Fatalf("ip route get %s from %s in %s: %v: %s", dst, src, ns, err, out)
			}
			return strings.Contains(string(out), "mtu 1464")
		}
		forget := func(t *testing.T) {
			t.Helper()
			for _, ns := range []string{p.a, p.b} {
				p.sh(t, ns, "ip", "route", "flush", "cache")
			}
			if learned(t, p.a, "10.2.0.3", "10.1.0.13") || learned(t, p.b, "10.1.0.13", "10.2.0.3") {
				t.Fatal("a path MTU survived ip route flush cache")
			}
		}

		// A superpacket's segments are lowered by 36 bytes and fit, but
		// TCP builds a superpacket only for more than one MSS: a segment
		// of exactly one MSS that goes alone (the tail of a burst, what
		// the window left room for; 1 run in 10 had one) is 1500 bytes
		// with DF and is answered like any other, and that end's TCP
		// learns the path MTU. Nothing is dropped either way.
		//
		// Such a segment is often a retransmission: the receiver's ACKs
		// come reordered, TCP retransmits a single segment fast, and it is
		// spurious (the first copy, a superpacket's, arrived). The ACK
		// covering it can then reach TCP before the answer does, and
		// TCP ignores an ICMP error about data already acknowledged
		// (tcp_v4_err: its quoted sequence number is outside [snd_una,
		// snd_nxt], counted as OutOfWindowIcmps) and learns nothing. So
		// what holds: every answer reaches the stack with a good checksum,
		// and the stack learns the path MTU unless TCP found every answer
		// out of window.
		type icmpSeen struct{ unreach, csumErrs, outOfWindow uint64 }
		seen := func(ns string) icmpSeen {
			return icmpSeen{
				netnstest.SNMP(t, ns, "Icmp", "InDestUnreachs"),
				netnstest.SNMP(t, ns, "Icmp", "InCsumErrors"),
				netnstest.Netstat(t, ns, "TcpExt", "OutOfWindowIcmps"),
			}
		}
		forget(t)
		g0, x0 := counters(t, gw), counters(t, xtr)
		sa0, sb0 := seen(p.a), seen(p.b)
		exchange(t, p.a, p.b, netip.MustParseAddrPort("10.1.0.13:0"), netip.MustParseAddrPort("10.2.0.3:5003"), 1<<20)
		for _, e := range []struct {
			name, ns, dst, src string
			c                  map[string]uint64
			s0                 icmpSeen
		}{
			{"gateway", p.a, "10.2.0.3", "10.1.0.13", counterDelta(g0, counters(t, gw)), sa0},
			{"xtr", p.b, "10.1.0.13", "10.2.0.3", counterDelta(x0, counters(t, xtr)), sb0},
		} {
			t.Logf("%s counted %v", e.name, e.c)
			if e.c["encapsulated"] == 0 || e.c["drop_too_big"] != 0 {
				t.Errorf("%s counted %v", e.name, e.c)
			}
			n := e.c["icmp_too_big"]
			if n == 0 {
				continue
			}
			s := seen(e.ns)
			unreach, csumErrs, outOfWindow := s.unreach-e.s0.unreach, s.csumErrs-e.s0.csumErrs, s.outOfWindow-e.s0.outOfWindow
			t.Logf("%s answered %d segments: its stack received %d destination unreachable, %d with a bad checksum, TCP found %d out of window", e.name, n, unreach, csumErrs, outOfWindow)
			if unreach != n || csumErrs != 0 {
				t.Errorf("%s answered %d segments with fragmentation needed but its stack received %d destination unreachable, %d with a bad checksum", e.name, n, unreach, csumErrs)
			}
			if outOfWindow != n && !learned(t, e.ns, e.dst, e.src) {
				t.Errorf("%s answered %d segments with fragmentation needed but its stack did not learn mtu 1464 (%d out of window)", e.name, n, outOfWindow)
			}
		}

		// The lone full segment made on purpose: one write of one MSS on a
		// fresh connection (Go sets TCP_NODELAY) leaves as one 1500-byte
		// packet whose TCP checksum the device is still to fill in
		// (CHECKSUM_PARTIAL). It is answered (not dropped: the answer
		// used to fail there, as the helper will not cut a pending
		// checksum off, and the segment was lost to drop_too_big), TCP
		// lowers its MSS and resends it at once, and it arrives.
		forget(t)
		g0 = counters(t, gw)
		lone(t, p.a, p.b, netip.MustParseAddrPort("10.1.0.13:0"), netip.MustParseAddrPort("10.2.0.3:5004"))
		if c := counterDelta(g0, counters(t, gw)); c["icmp_too_big"] != 1 || c["drop_too_big"] != 0 {
			t.Errorf("a lone 1500-byte TCP segment: counted %v, want icmp_too_big 1 and nothing dropped", c)
		}
		if !learned(t, p.a, "10.2.0.3", "10.1.0.13") {
			t.Error("the gateway's stack did not learn the path MTU from the answer to its TCP segment")
		}

		// A 1500-byte ping with DF is 36 bytes too big for path 1: the
		// gateway's datapath answers fragmentation needed (mtu 1464), the
		// stack records the path MTU, and a 1464-byte ping goes through.
		forget(t)
		g0 = counters(t, gw)
		out, _ := exec.Command("ip", "netns", "exec", p.a, "ping", "-n", "-c", "1", "-W", "1", "-M", "do", "-s", "1472", "-I", "10.1.0.13", "10.2.0.3").CombinedOutput()
		if c := counterDelta(g0, counters(t, gw)); c["icmp_too_big"] != 1 {
			t.Errorf("1500-byte DF ping: counted %v, want icmp_too_big 1; ping said %s", c, out)
		}
		if !learned(t, p.a, "10.2.0.3", "10.1.0.13") {
			t.Error("the stack did not learn the path MTU from the answer to the ping")
		}
		p.sh(t, p.a, "ping", "-n", "-c", "1", "-W", "2", "-M", "do", "-s", "1436", "-I", "10.1.0.13", "10.2.0.3")
	})

	t.Run("to a destination no EID prefix covers: native", func(t *testing.T) {
		g0, x0 := counters(t, gw), counters(t, xtr)
		exchange(t, p.a, p.b, netip.MustParseAddrPort("192.0.2.1:0"), netip.MustParseAddrPort("172.16.0.2:5002"), 64<<10)
		if d := counterDelta(g0, counters(t, gw)); len(d) != 0 {
			t.Errorf("gateway counted %v", d)
		}
		if d := counterDelta(x0, counters(t, xtr)); len(d) != 0 {
			t.Errorf("xtr counted %v", d)
		}
	})
}

func pathStats(t *testing.T, d *Kernel) map[uint8]Stats {
	t.Helper()
	s, err := d.PathStats()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func sub(a, b map[uint8]Stats) map[uint8]Stats {
	out := map[uint8]Stats{}
	for id, s := range a {
		o := b[id]
		out[id] = Stats{s.TxPackets - o.TxPackets, s.TxBytes - o.TxBytes, s.RxPackets - o.RxPackets, s.RxBytes - o.RxBytes}
	}
	return out
}

// TestPrivilegedSuperpacketsForLocalSocketsAreDecapsulatedWhole: the xTR's
// interface keeps tunnel segmentation (WholeSuperpackets), so the replies
// to the gateway's subflow arrive as UDP-tunnel superpackets; the
// gateway's lisp_decap, on a kernel without DecapsGSO, strips them whole
// because each is for one of its own TCP sockets. The content arrives
// intact by hash, nothing is dropped, and the gateway counts superpackets
// (fewer decapsulations than segments). Before lisp_decap knew local
// sockets every such superpacket was dropped (drop_gso_decap) and the
// transfer stalled.
func TestPrivilegedSuperpacketsForLocalSocketsAreDecapsulatedWhole(t *testing.T) {
	p := newPair(t)
	gw := open(t, Options{Netns: netns.Path(p.a)})
	xtr := open(t, Options{Netns: netns.Path(p.b)})
	if err := gw.SetPath(1, p.lispPath(t, p.ha, p.hb, "a1", "b1", "192.0.2.1", "192.0.2.2")); err != nil {
		t.Fatal(err)
	}
	if err := xtr.SetPath(1, p.lispPath(t, p.hb, p.ha, "b1", "a1", "192.0.2.2", "192.0.2.1")); err != nil {
		t.Fatal(err)
	}
	if err := gw.AttachRLOC("a1"); err != nil {
		t.Fatal(err)
	}
	if err := xtr.AttachRLOCWith("b1", RLOCOptions{WholeSuperpackets: true}); err != nil {
		t.Fatal(err)
	}
	if gw.DecapsGSO() {
		t.Log("this kernel decapsulates superpackets in place (BPF_F_ADJ_ROOM_DECAP_L4_UDP): the local-socket path is not exercised")
	}
	out, err := exec.Command("ip", "netns", "exec", p.b, "ethtool", "-k", "b1").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "tx-udp_tnl-segmentation: on") {
		t.Fatalf("b1 does not send tunnel superpackets whole: %v: %s", err, out)
	}
	onePath(t, gw, xtr)
	g0, s0 := counters(t, gw), pathStats(t, gw)
	const n = 8 << 20
	exchange(t, p.a, p.b, netip.MustParseAddrPort("10.1.0.11:0"), netip.MustParseAddrPort("10.2.0.2:5011"), n)
	if gw.DecapsGSO() {
		t.Logf("gateway counters %v", counterDelta(g0, counters(t, gw)))
	} else {
		wholeDecaps(t, "gateway, download", gw, g0, s0, n)
	}
	noDrops(t, "download", gw, xtr)
}

// TestPrivilegedForgedInnerSourceFromAKnownRLOCIsNotDelivered is the attack
// run's: something on the WAN path (here A, which owns path 1's gateway
// RLOC) sends LISP data from the gateway's RLOC with an arbitrary inner
// source, and the xTR (B) handed it to its server. Now B decapsulates an
// inner source only from the RLOCs its mapping lists: the gateway's EID
// registered behind path 1's RLOC is delivered (the control, counted
// decapsulated); an address no mapping covers, and the gateway's other EID
// (registered behind path 2's RLOC) sent over path 1, are dropped and
// counted drop_source_eid, and the server's socket never sees them.
func TestPrivilegedForgedInnerSourceFromAKnownRLOCIsNotDelivered(t *testing.T) {
	p := newPair(t)
	xtr := open(t, Options{Netns: netns.Path(p.b)})
	for id, l := range map[uint8][4]string{1: {"a1", "b1", "192.0.2.1", "192.0.2.2"}, 2: {"a2", "b2", "192.0.2.5", "192.0.2.6"}} {
		if err := xtr.SetPath(id, p.lispPath(t, p.hb, p.ha, l[1], l[0], l[3], l[2])); err != nil {
			t.Fatal(err)
		}
		if err := xtr.AttachRLOC(l[1]); err != nil {
			t.Fatal(err)
		}
	}
	// What the gateway registers: each path's EID behind that path's RLOC.
	for eid, id := range map[string]uint8{"10.1.0.11/32": 1, "10.1.0.12/32": 2} {
		if err := xtr.SetEID(netip.MustParsePrefix(eid), []PathChoice{{ID: id, Priority: 1, Weight: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	var server *net.UDPConn
	if err := netns.Do(p.b, func() (err error) {
		server, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 2, 0, 2), Port: 7000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	var wan *net.UDPConn // path 1's gateway RLOC towards the xTR's
	if err := netns.Do(p.a, func() (err error) {
		wan, err = net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1)}, &net.UDPAddr{IP: net.IPv4(192, 0, 2, 2), Port: DataPort})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wan.Close() })
	send := func(src, body string) {
		t.Helper()
		in := inner{proto: layers.IPProtocolUDP, src: src, dst: "10.2.0.2", sport: 40000, dport: 7000, body: body}
		lispHdr := []byte{0x80, 0x12, 0x34, 0x56, 0, 0, 0, 0} // N, a nonce
		if _, err := wan.Write(append(lispHdr, in.ip(t)...)); err != nil {
			t.Fatal(err)
		}
	}
	next := func() string {
		t.Helper()
		buf := make([]byte, 2048)
		server.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := server.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("the server got nothing: %v (xtr counters %v)", err, counters(t, xtr))
		}
		return from.Addr().String() + " " + string(buf[:n])
	}

	c0 := counters(t, xtr)
	send("10.1.0.11", "control")
	if got := next(); got != "10.1.0.11 control" {
		t.Fatalf("control: the server got %q", got)
	}
	if c := counterDelta(c0, counters(t, xtr)); c["decapsulated"] != 1 || len(c) != 1 {
		t.Fatalf("control counted %v, want decapsulated 1", c)
	}

	c0 = counters(t, xtr)
	send("10.66.6.6", "forged: any address")
	send("10.1.0.12", "forged: the gateway's path-2 EID over path 1")
	send("10.1.0.11", "marker") // arrives after the forgeries would have
	if got := next(); got != "10.1.0.11 marker" {
		t.Fatalf("the server's next datagram after two forgeries is %q, want the marker", got)
	}
	if c := counterDelta(c0, counters(t, xtr)); c["drop_source_eid"] != 2 || c["decapsulated"] != 1 || len(c) != 2 {
		t.Fatalf("counted %v, want drop_source_eid 2 and decapsulated 1 (the marker)", c)
	}
}
