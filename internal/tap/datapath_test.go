package tap

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/csum"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ipam"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// The BPF_PROG_RUN tests run in a namespace of their own with real veth
// pairs for the uplink and the monitors' vifs: bpf_clone_redirect sends a
// copy at once, so each copy is read, whole, by a packet socket on the far
// end, as the monitor VM (or the fabric) would receive it.

var (
	h1MAC    = bpftest.MustMAC("aa:00:00:00:00:01")
	h2MAC    = bpftest.MustMAC("aa:00:00:00:00:02")
	h3MAC    = bpftest.MustMAC("aa:00:00:00:00:03")
	rogueMAC = bpftest.MustMAC("aa:00:00:00:00:99")

	web3 = netip.MustParseAddr("10.1.1.4")  // local on h1, a receiver
	mon4 = netip.MustParseAddr("10.1.1.12") // local on h1, a second monitor
	mon5 = netip.MustParseAddr("10.1.1.13") // on h3
	mon6 = netip.MustParseAddr("10.1.1.14") // on h2, beside mon2
	far  = netip.MustParseAddr("10.1.1.77") // remote, not mapped yet
)

func vmac(a netip.Addr) net.HardwareAddr { return ipam.VirtualMAC(a) }

// lab is one host's datapath in a namespace of its own: its links, and a
// packet socket on the far end of each.
type lab struct {
	ns      string
	ifindex map[string]int         // host-side links by name
	capture map[string]*packetSock // by host-side link name
}

// newLab makes the namespace with a veth pair per name (NAME on the host's
// side, NAME-p on the far side, both up) and a capture on each far end.
func newLab(t testing.TB, names ...string) *lab {
	t.Helper()
	testenv.RequireRoot(t, "BPF_PROG_RUN and namespaces")
	l := &lab{ns: netnstest.New(t, "taptest"), ifindex: map[string]int{}, capture: map[string]*packetSock{}}
	h, err := netns.Handle(l.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, n := range names {
		netnstest.Veth(t, n, l.ns, n+"-p", l.ns)
		for _, end := range []string{n, n + "-p"} {
			link, err := h.LinkByName(end)
			if err != nil {
				t.Fatal(err)
			}
			if end == n {
				l.ifindex[n] = link.Attrs().Index
			} else {
				ps, err := openCapture(l.ns, link.Attrs().Index)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { ps.close() })
				l.capture[n] = ps
			}
		}
	}
	return l
}

// packetSock reads the IPv4 frames that arrive on one link.
type packetSock struct{ fd int }

func openCapture(ns string, ifindex int) (*packetSock, error) {
	var ps *packetSock
	err := netns.Do(ns, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IP)))
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifindex}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind packet socket to %d: %w", ifindex, err)
		}
		ps = &packetSock{fd: fd}
		return nil
	})
	return ps, err
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func (p *packetSock) close() { unix.Close(p.fd) }

// next is the next frame that arrived (not one the far end sent), or nil
// after wait.
func (p *packetSock) next(wait time.Duration) ([]byte, error) {
	deadline := time.Now().Add(wait)
	buf := make([]byte, 65536)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, nil
		}
		fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("poll: %w", err)
		}
		if n == 0 {
			return nil, nil
		}
		m, from, err := unix.Recvfrom(p.fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("recv: %w", err)
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		return append([]byte(nil), buf[:m]...), nil
	}
}

// drain throws away whatever arrived so far.
func (p *packetSock) drain(t testing.TB) {
	t.Helper()
	for {
		b, err := p.next(0)
		if err != nil {
			t.Fatal(err)
		}
		if b == nil {
			return
		}
	}
}

// frame is a test frame as this package's rows write it: IP id 7, ICMP an
// echo request with id 3, and a payload of 32 bytes of text where a row
// says nothing.
type frame bpftest.Frame

func (f frame) bytes(t testing.TB) []byte {
	t.Helper()
	g := bpftest.Frame(f)
	if g.IPID == 0 {
		g.IPID = 7
	}
	if g.ICMPType == 0 && g.ICMPID == 0 {
		g.ICMPType, g.ICMPID = 8, 3
	}
	if g.Payload == nil {
		g.Payload = []byte("the tapped payload, 32 bytes....")
	}
	return g.Bytes(t)
}

// asSeen is b (an IPv4 frame) as the receiver of its packet sees it: its
// own virtual MAC as destination, from the sender's (same subnet) or the
// gateway's.
func asSeen(b []byte) []byte {
	out := append([]byte(nil), b...)
	src, dst := netip.AddrFrom4([4]byte(out[26:30])), netip.AddrFrom4([4]byte(out[30:34]))
	copy(out[0:6], vmac(dst))
	from := src
	if s, d := src.As4(), dst.As4(); s[1] != d[1] || s[2] != d[2] {
		from = netip.AddrFrom4([4]byte{d[0], d[1], d[2], 1})
	}
	copy(out[6:12], vmac(from))
	return out
}

// marked is b as a copy on the fabric: host MAC to host MAC, the reserved
// flag set and the header checksum fixed.
func marked(b []byte, from, to net.HardwareAddr) []byte {
	out := append([]byte(nil), b...)
	copy(out[0:6], to)
	copy(out[6:12], from)
	out[20] |= 0x80
	csum.SetIPv4(out[14:])
	return out
}

// host is one host's loaded datapath: the router's maps as its agent
// writes them, the TAP's from Compile and Sync.
type host struct {
	name string
	mac  net.HardwareAddr
	k    *datapath.Kernel
	f    *Feature
	lab  *lab
}

// h1Desired: web1 sends (on lo, ifindex 1: BPF_PROG_RUN's device), web3,
// mon1 and mon4 are local; web2, db1, mon2 and mon6 live on h2, mon5 on h3.
func h1Desired(taps []intent.TapRule) intent.Desired {
	local := func(name string, a netip.Addr) intent.LocalEndpoint {
		return intent.LocalEndpoint{Name: "blue/web/" + name, IP: a.String(), MAC: vmac(a).String(), Interface: "vif-" + name}
	}
	return intent.Desired{
		Node: "h1", VMNet: "10.0.0.0/8",
		Local: []intent.LocalEndpoint{local("web1", web1), local("web3", web3), local("mon1", mon1), local("mon4", mon4)},
		// web may reach db on tcp/5432.
		Visibility: []intent.VisRule{{SrcFarm: 1, SrcSubnet: 1, DstFarm: 1, DstSubnet: 2, Proto: 6, Port: 5432}},
		Taps:       taps,
	}
}

var testNodes = []intent.Node{
	{Name: "h1", UplinkMAC: h1MAC.String()},
	{Name: "h2", UplinkMAC: h2MAC.String()},
	{Name: "h3", UplinkMAC: h3MAC.String()},
}

// newHost loads a datapath for node name in l, with desired state d; vif
// names are mapped to l's links ("vif-web1" to lo).
func newHost(t testing.TB, l *lab, name string, mac net.HardwareAddr, d intent.Desired, remote map[netip.Addr]net.HardwareAddr) *host {
	t.Helper()
	return loadHost(t, l, name, mac, d, remote, datapath.OpenTestObjects)
}

// loadHost is newHost with the objects open loads (the production ones for
// the cost benchmarks).
func loadHost(t testing.TB, l *lab, name string, mac net.HardwareAddr, d intent.Desired, remote map[netip.Addr]net.HardwareAddr,
	open func() (*datapath.Kernel, error)) *host {
	t.Helper()
	k, err := open()
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("load datapath: %v\nverifier log:\n%+v", err, ve)
		}
		t.Fatalf("load datapath: %v", err)
	}
	t.Cleanup(func() { k.Close() })
	ifindexOf := func(n string) (int, error) {
		if n == "vif-web1" {
			return 1, nil
		}
		if i, ok := l.ifindex[n]; ok {
			return i, nil
		}
		return 0, os.ErrNotExist
	}
	e, missing, err := datapath.Compile(d, datapath.Uplink{Ifindex: l.ifindex["up0"], MAC: mac}, ifindexOf)
	if err != nil || len(missing) != 0 {
		t.Fatalf("compile %s: %v (missing %v)", name, err, missing)
	}
	if e.Hosts, err = datapath.CompileHosts(testNodes, name); err != nil {
		t.Fatal(err)
	}
	e.Attach = nil
	if err := k.Apply(e, ""); err != nil {
		t.Fatalf("apply %s: %v", name, err)
	}
	// What its ARP engine would have learned.
	mappings, err := k.Map("mappings")
	if err != nil {
		t.Fatal(err)
	}
	for a, hm := range remote {
		var m datapath.Mapping
		copy(m.HostMac[:], hm)
		now := monotonicNow()
		m.ConfirmedNs, m.UsedNs = now, now
		if err := mappings.Put(datapath.IPKey(a), m); err != nil {
			t.Fatal(err)
		}
	}
	h := &host{name: name, mac: mac, k: k, f: New(k), lab: l}
	h.sync(t, d, testNodes, ifindexOf)
	return h
}

func monotonicNow() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return uint64(ts.Nano())
}

// sync compiles and syncs the TAP as the agent would, and sets its bit
// when the plan is in use.
func (h *host) sync(t testing.TB, d intent.Desired, nodes []intent.Node, ifindexOf func(string) (int, error)) Plan {
	t.Helper()
	// The uplink as the agent gives it (feature.Node), as the router wrote it.
	p, err := Compile(feature.Node{Name: h.name, Desired: d, Nodes: nodes, Ifindex: ifindexOf, UplinkIfindex: h.lab.ifindex["up0"],
		Uplinks:  []feature.Uplink{{Name: "up0", Ifindex: h.lab.ifindex["up0"], MAC: h.mac, Addr: hostAddr[h.name]}},
		Neighbor: fabricNeighbor})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Missing) != 0 {
		t.Fatalf("missing monitors: %+v", p.Missing)
	}
	caps := func(name string) int { return h.k.Capacity(name) }
	if err := feature.CheckFit("tap", p.Sizes(), caps); err != nil {
		t.Fatal(err)
	}
	if err := h.f.Sync(p); err != nil {
		t.Fatalf("sync: %v", err)
	}
	h.setBit(t, p.InUse())
	return p
}

func (h *host) setBit(t testing.TB, on bool) {
	t.Helper()
	bits, err := h.k.Features()
	if err != nil {
		t.Fatal(err)
	}
	bits &^= datapath.FeatureTap
	if on {
		bits |= datapath.FeatureTap
	}
	if err := h.k.SetFeatures(bits); err != nil {
		t.Fatal(err)
	}
}

// run runs prog on in inside the lab's namespace (where the copies'
// devices are).
func (h *host) run(t testing.TB, prog *ebpf.Program, in []byte) bpftest.Result {
	t.Helper()
	return bpftest.RunWith(t, prog, in, func(run func() error) error { return netns.Do(h.lab.ns, run) })
}

// statsByID reads each rule's counters.
func (h *host) statsByID(t *testing.T) map[uint32]intent.TapStats {
	t.Helper()
	st, err := h.f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint32]intent.TapStats{}
	for _, s := range st {
		out[s.ID] = s
	}
	return out
}

func (h *host) counters(t *testing.T) datapath.Counters {
	t.Helper()
	c, err := h.k.Counters()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// copyWant is one copy a row expects: on which link it arrives, and its
// bytes.
type copyWant struct {
	link  string
	bytes []byte
}

// row is one table row: the frame in, what production does with it
// (checked against the same run with the TAP off), the copies, the
// counters.
type row struct {
	name    string
	in      frame
	verdict uint32
	to      string // the production redirect's link ("lo": ifindex 1)
	copies  []copyWant
	drop    string            // the drop counter that rises by one
	forward map[string]uint64 // forward counters that rise, and by how much
	copied  []uint32          // rules whose copies rise by one (packets, bytes)
	dropped []uint32          // rules whose dropped copies rise by one
}

func (h *host) linkIndex(name string) uint32 {
	if name == "lo" {
		return 1
	}
	return uint32(h.lab.ifindex[name])
}

// runRows runs each row with the TAP off, then on: production must be the
// same, and the copies exactly the row's.
func (h *host) runRows(t *testing.T, prog *ebpf.Program, rows []row) {
	t.Helper()
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			in := r.in.bytes(t)
			h.setBit(t, false)
			base := h.run(t, prog, in)
			h.setBit(t, true)
			for _, c := range h.lab.capture {
				c.drain(t)
			}
			before := h.rowCounters(t)
			got := h.run(t, prog, in)
			after := h.rowCounters(t)
			// Bound for the uplink with copies due, production leaves
			// first as a clone (so it queues ahead of its copies) and the
			// frame is consumed: that first clone is production, and it
			// must reach its link before any copy, as it was.
			if got.Verdict == bpftest.ActStolen {
				if len(got.Clones) == 0 {
					t.Fatalf("frame consumed, but nothing sent")
				}
				got.To, got.Kind, got.Verdict, got.Clones = got.Clones[0], bpftest.RedirectOut, bpftest.ActRedirect, got.Clones[1:]
				c, ok := h.lab.captureOf(got.To)
				if !ok {
					t.Fatalf("production left by link %d, which has no capture to check it on", got.To)
				}
				{
					b, err := c.next(2 * time.Second)
					if err != nil {
						t.Fatal(err)
					}
					if b == nil {
						t.Fatalf("production never arrived on link %d", got.To)
					}
					if len(b) > len(base.Out) || !bytes.Equal(b, base.Out[:len(b)]) {
						t.Errorf("the first frame out of %d is not production as it was:\n got %x\nwant %x", got.To, b, base.Out[:len(b)])
					}
				}
				// The consumed frame's own bytes went nowhere; what left
				// was just checked.
				got.Out = base.Out
			}

			// Production: as without the TAP, and as the row says.
			sameBytes := base.Verdict == bpftest.ActShot || bytes.Equal(got.Out, base.Out) // a dropped frame's bytes go nowhere
			if got.Verdict != base.Verdict || got.To != base.To || got.Kind != base.Kind || !sameBytes {
				t.Errorf("production changed by the TAP: verdict %d to %d (kind %d), want %d to %d (kind %d); bytes equal: %v",
					got.Verdict, got.To, got.Kind, base.Verdict, base.To, base.Kind, bytes.Equal(got.Out, base.Out))
			}
			if len(base.Clones) != 0 {
				t.Errorf("copies with the TAP off: %v", base.Clones)
			}
			if got.Verdict != r.verdict {
				t.Fatalf("verdict %d, want %d", got.Verdict, r.verdict)
			}
			if r.to != "" && got.To != h.linkIndex(r.to) {
				t.Errorf("production went to %d, want %s (%d)", got.To, r.to, h.linkIndex(r.to))
			}
			// The copies: where (the redirect log), and what arrived.
			var wantClones []uint32
			for _, c := range r.copies {
				wantClones = append(wantClones, h.linkIndex(c.link))
			}
			if fmt.Sprint(got.Clones) != fmt.Sprint(wantClones) {
				t.Errorf("copies to %v, want %v", got.Clones, wantClones)
			}
			arrived := map[string][][]byte{}
			for _, c := range r.copies {
				if _, done := arrived[c.link]; done {
					continue
				}
				for range countLink(r.copies, c.link) {
					b, err := h.lab.capture[c.link].next(2 * time.Second)
					if err != nil {
						t.Fatal(err)
					}
					if b == nil {
						t.Fatalf("a copy to %s never arrived", c.link)
					}
					arrived[c.link] = append(arrived[c.link], b)
				}
			}
			for _, c := range r.copies {
				found := false
				for _, b := range arrived[c.link] {
					if bytes.Equal(b, c.bytes) {
						found = true
					}
				}
				if !found {
					t.Errorf("no copy on %s with the bytes wanted:\nwant %x\n got %x", c.link, c.bytes, arrived[c.link])
				}
				if sum := csum.Checksum(c.bytes[14:34]); sum != 0 {
					t.Errorf("the wanted copy's IPv4 checksum does not verify (%#04x)", sum)
				}
			}
			// Counters.
			want := bpftest.Counters{}
			if r.drop != "" {
				want["drop "+r.drop] = 1
			}
			for _, name := range tapForwards {
				want["forward "+name] = r.forward[name]
			}
			for _, id := range r.copied {
				want[fmt.Sprintf("rule %d packets", id)] = 1
				want[fmt.Sprintf("rule %d bytes", id)] = uint64(len(in))
			}
			for _, id := range r.dropped {
				want[fmt.Sprintf("rule %d dropped", id)] = 1
			}
			bpftest.CheckDelta(t, before, after, want)
		})
	}
}

// tapForwards are the node's forward counters a row speaks of: every other
// moves the same with the TAP off.
var tapForwards = []string{"tap_copy_local", "tap_copy_remote", "tap_copy_recovered"}

// rowCounters is every counter a row speaks of: the node's drop counters,
// the TAP's forward counters, and each rule's packets, bytes and dropped
// copies.
func (h *host) rowCounters(t *testing.T) bpftest.Counters {
	t.Helper()
	c := h.counters(t)
	out := bpftest.Counters{}.Add("drop", c.Drops)
	for _, name := range tapForwards {
		if n, ok := c.Forwards[name]; ok {
			out["forward "+name] = n
		}
	}
	for id, st := range h.statsByID(t) {
		out[fmt.Sprintf("rule %d packets", id)] = st.Packets
		out[fmt.Sprintf("rule %d bytes", id)] = st.Bytes
		out[fmt.Sprintf("rule %d dropped", id)] = st.Dropped
	}
	return out
}

func countLink(cs []copyWant, link string) []struct{} {
	var n []struct{}
	for _, c := range cs {
		if c.link == link {
			n = append(n, struct{}{})
		}
	}
	return n
}

func withFilter(r intent.TapRule, proto uint8, sport, dport [2]uint16) intent.TapRule {
	r.Proto = proto
	r.SportLo, r.SportHi = sport[0], sport[1]
	r.DportLo, r.DportHi = dport[0], dport[1]
	return r
}

// h1Taps are the rules h1 plays a part in (as the controller compiles
// them: monitors placed on their hosts).
func h1Taps() []intent.TapRule {
	const tcp, udp, icmp = 6, 17, 1
	none := [2]uint16{}
	vlan := func(r intent.TapRule, v uint16) intent.TapRule { r.VLAN = v; return r }
	return []intent.TapRule{
		rule(1, vm(web1), vm(web3), mon1, "h1"),                                           // everything web1 sends web3, to a local monitor
		withFilter(rule(2, vm(web1), vm(web2), mon2, "h2"), tcp, none, [2]uint16{80, 80}), // web1's HTTP to web2, to h2's monitor
		withFilter(rule(3, subnet(1, 1), anyEnd, mon1, "h1"), udp, [2]uint16{5000, 5001}, none),
		withFilter(rule(4, anyEnd, vm(web2), mon4, "h1"), udp, none, [2]uint16{9000, 9000}),
		withFilter(rule(5, vm(web1), vm(db1), mon5, "h3"), tcp, none, [2]uint16{5432, 5432}), // routed, to h3's monitor
		withFilter(rule(6, anyEnd, anyEnd, mon2, "h2"), icmp, none, none),
		withFilter(rule(8, vm(web1), anyEnd, mon6, "h2"), icmp, none, none), // a second monitor on h2
		withFilter(rule(9, anyEnd, vm(web2), mon5, "h3"), icmp, none, none),
		vlan(withFilter(rule(7, anyEnd, anyEnd, mon1, "h1"), udp, none, none), 1*256+2), // senders of 10.1.2.0/24 only
		rule(10, vm(web2), vm(web3), mon1, "h1"),                                        // from h2's web2: recovered here
	}
}

func newH1(t *testing.T) *host {
	l := newLab(t, "up0", "vif-web3", "vif-mon1", "vif-mon4")
	return newHost(t, l, "h1", h1MAC, h1Desired(h1Taps()), map[netip.Addr]net.HardwareAddr{
		web2: h2MAC, db1: h2MAC, mon2: h2MAC, mon6: h2MAC, mon5: h3MAC})
}

func TestPrivilegedSenderEdgeCopiesMatchingPacketsAndLeavesProductionAlone(t *testing.T) {
	h := newH1(t)
	tcp, udp, icmp := layers.IPProtocolTCP, layers.IPProtocolUDP, layers.IPProtocolICMPv4
	from := func(dst netip.Addr, proto layers.IPProtocol, sport, dport uint16) frame {
		return frame{Src: vmac(web1), Dst: vmac(dst), Saddr: web1, Daddr: dst, Proto: proto, Sport: sport, Dport: dport}
	}
	routed := from(db1, tcp, 40000, 5432)
	routed.Dst = vmac(gw)
	local := func(f frame) []byte { return asSeen(f.bytes(t)) } // what web3 (or the monitor) gets
	// What production sends to h2, with TTL one less when routed.
	toFabric := func(f frame, hop bool) frame {
		if hop {
			f.TTL = 63
		}
		f.Src, f.Dst = h1MAC, h2MAC
		return f
	}
	remoteCopy := func(f frame, hostMAC net.HardwareAddr) []byte {
		return marked(f.bytes(t), h1MAC, hostMAC)
	}
	fabricLocal := func(f frame) []byte { return asSeen(f.bytes(t)) }
	one := func(n string) map[string]uint64 { return map[string]uint64{n: 1} }

	h.runRows(t, h.k.VifProgram(), []row{
		{name: "vm to local vm, any protocol: one copy into the local monitor, as the receiver sees it",
			in: from(web3, tcp, 40000, 80), verdict: bpftest.ActRedirect, to: "vif-web3",
			copies: []copyWant{{"vif-mon1", local(from(web3, tcp, 40000, 80))}}, forward: one("tap_copy_local"), copied: []uint32{1}},
		{name: "two rules, one monitor: one copy, both rules count it",
			in: from(web3, udp, 5000, 53), verdict: bpftest.ActRedirect, to: "vif-web3",
			copies: []copyWant{{"vif-mon1", local(from(web3, udp, 5000, 53))}}, forward: one("tap_copy_local"), copied: []uint32{1, 3}},
		{name: "source port range: its upper end matches",
			in: from(web2, udp, 5001, 53), verdict: bpftest.ActRedirect, to: "up0",
			copies: []copyWant{{"vif-mon1", fabricLocal(toFabric(from(web2, udp, 5001, 53), false))}}, forward: one("tap_copy_local"), copied: []uint32{3}},
		{name: "source port range: one past it does not",
			in: from(web2, udp, 5002, 53), verdict: bpftest.ActRedirect, to: "up0"},
		{name: "remote receiver, remote monitor: one marked copy to its host, host MAC to host MAC",
			in: from(web2, tcp, 40000, 80), verdict: bpftest.ActRedirect, to: "up0",
			copies: []copyWant{{"up0", remoteCopy(toFabric(from(web2, tcp, 40000, 80), false), h2MAC)}}, forward: one("tap_copy_remote"), copied: []uint32{2}},
		{name: "destination port filter: another port is not copied",
			in: from(web2, tcp, 40000, 81), verdict: bpftest.ActRedirect, to: "up0"},
		{name: "protocol filter: udp to the tcp rule's port is not copied",
			in: from(web2, udp, 40000, 80), verdict: bpftest.ActRedirect, to: "up0"},
		{name: "two monitors on this host: two copies",
			in: from(web2, udp, 5000, 9000), verdict: bpftest.ActRedirect, to: "up0",
			copies: []copyWant{
				{"vif-mon1", fabricLocal(toFabric(from(web2, udp, 5000, 9000), false))},
				{"vif-mon4", fabricLocal(toFabric(from(web2, udp, 5000, 9000), false))}},
			forward: map[string]uint64{"tap_copy_local": 2}, copied: []uint32{3, 4}},
		{name: "routed: the copy has the hop the receiver sees, to h3's monitor",
			in: routed, verdict: bpftest.ActRedirect, to: "up0",
			copies:  []copyWant{{"up0", remoteCopy(toFabric(routed, true), h3MAC)}},
			forward: one("tap_copy_remote"), copied: []uint32{5}},
		{name: "three rules, two monitor hosts: one copy per host",
			in: from(web2, icmp, 0, 0), verdict: bpftest.ActRedirect, to: "up0",
			copies: []copyWant{
				{"up0", remoteCopy(toFabric(from(web2, icmp, 0, 0), false), h2MAC)},
				{"up0", remoteCopy(toFabric(from(web2, icmp, 0, 0), false), h3MAC)}},
			forward: map[string]uint64{"tap_copy_remote": 2}, copied: []uint32{6, 8, 9}},
		{name: "not admitted: nothing copied",
			in: from(db1, tcp, 40000, 80), verdict: bpftest.ActShot, drop: "not_visible"},
		{name: "a VM's frame carrying the copy marker is dropped, never copied",
			in:      frame{Src: vmac(web1), Dst: vmac(web3), Saddr: web1, Daddr: web3, Proto: tcp, Sport: 1, Dport: 80, Reserved: true},
			verdict: bpftest.ActShot, drop: "reserved_flag"},
	})
}

// gw is web's gateway.
var gw = netip.MustParseAddr("10.1.1.1")

func TestPrivilegedHeldPacketsAreCopiedToo(t *testing.T) {
	h := newH1(t)
	in := frame{Src: vmac(web1), Dst: vmac(far), Saddr: web1, Daddr: far, Proto: layers.IPProtocolICMPv4}
	// Held for the agent while it resolves far; its copy is made now.
	out := in
	out.Src, out.Dst = h1MAC, h2MAC
	h.runRows(t, h.k.VifProgram(), []row{{name: "held", in: in, verdict: bpftest.ActShot,
		copies:  []copyWant{{"up0", remoteCopy(t, out, h2MAC)}},
		forward: map[string]uint64{"tap_copy_remote": 1}, copied: []uint32{6, 8}}})
}

func remoteCopy(t *testing.T, f frame, hostMAC net.HardwareAddr) []byte {
	return marked(f.bytes(t), h1MAC, hostMAC)
}

func TestPrivilegedMonitorEdgeRecoversTheOriginalForLocalMonitorsOnly(t *testing.T) {
	h := newH1(t)
	udp, tcp := layers.IPProtocolUDP, layers.IPProtocolTCP
	// orig is what the receiver sees; the copy on the fabric is it marked.
	orig := func(src, dst netip.Addr, proto layers.IPProtocol) frame {
		return frame{Src: vmac(src), Dst: vmac(dst), Saddr: src, Daddr: dst, Proto: proto, Sport: 40000, Dport: 53}
	}
	seen := func(f frame) []byte { return asSeen(f.bytes(t)) }
	copyOf := func(f frame, from, to net.HardwareAddr) frame {
		f.Reserved, f.Src, f.Dst = true, from, to
		return f
	}
	one := func(n string) map[string]uint64 { return map[string]uint64{n: 1} }
	h.runRows(t, h.k.UplinkProgram(), []row{
		{name: "a copy for a local monitor: restored, to it alone, never to its local receiver",
			in: copyOf(orig(web2, web3, tcp), h2MAC, h1MAC), verdict: bpftest.ActShot,
			copies: []copyWant{{"vif-mon1", seen(orig(web2, web3, tcp))}}, forward: one("tap_copy_recovered"), copied: []uint32{10}},
		{name: "the same packet unmarked is production: delivered, not copied here",
			in: frame{Src: h2MAC, Dst: h1MAC, Saddr: web2, Daddr: web3, Proto: tcp, Sport: 40000, Dport: 53}, verdict: bpftest.ActRedirect, to: "vif-web3"},
		{name: "a VLAN rule: a sender of its segment",
			in: copyOf(orig(db1, web1, udp), h2MAC, h1MAC), verdict: bpftest.ActShot,
			copies: []copyWant{{"vif-mon1", seen(orig(db1, web1, udp))}}, forward: one("tap_copy_recovered"), copied: []uint32{7}},
		{name: "a VLAN rule: a sender of another segment is no copy anyone here wants",
			in: copyOf(orig(web2, web1, udp), h2MAC, h1MAC), verdict: bpftest.ActShot, drop: "tap_copy_unknown"},
		{name: "a copy a local rule's filters refuse",
			in: copyOf(orig(db1, web1, tcp), h2MAC, h1MAC), verdict: bpftest.ActShot, drop: "tap_copy_unknown"},
		{name: "a copy from a MAC that is no host's",
			in: copyOf(orig(web2, web3, tcp), rogueMAC, h1MAC), verdict: bpftest.ActShot, drop: "fabric_unknown_host"},
		{name: "a copy from the wrong host for its sender",
			in: copyOf(orig(web2, web3, tcp), h3MAC, h1MAC), verdict: bpftest.ActShot, drop: "fabric_unknown_src"},
		{name: "a copy flooded towards another host",
			in: copyOf(orig(web2, web3, tcp), h2MAC, h3MAC), verdict: bpftest.ActShot, drop: "tap_copy_unknown"},
	})
}

func TestPrivilegedACopyIsDroppedWhereNoRuleIsInUse(t *testing.T) {
	h := newH1(t)
	h.sync(t, h1Desired(nil), testNodes, func(string) (int, error) { return 0, os.ErrNotExist })
	in := frame{Src: h2MAC, Dst: h1MAC, Saddr: web2, Daddr: web3, Proto: layers.IPProtocolTCP, Sport: 1, Dport: 2, Reserved: true}
	r := h.run(t, h.k.UplinkProgram(), in.bytes(t))
	if r.Verdict != bpftest.ActShot || r.To != 0 || len(r.Clones) != 0 {
		t.Fatalf("a copy on a node without TAP: verdict %d, to %d, copies %v; want dropped", r.Verdict, r.To, r.Clones)
	}
	vm := frame{Src: vmac(web1), Dst: vmac(web3), Saddr: web1, Daddr: web3, Proto: layers.IPProtocolTCP, Sport: 1, Dport: 2, Reserved: true}
	before := h.counters(t)
	if r := h.run(t, h.k.VifProgram(), vm.bytes(t)); r.Verdict != bpftest.ActShot || r.To != 0 {
		t.Fatalf("a VM's marked frame on a node without TAP: verdict %d, to %d", r.Verdict, r.To)
	}
	if d := h.counters(t).Drops["reserved_flag"] - before.Drops["reserved_flag"]; d != 1 {
		t.Fatalf("reserved_flag rose by %d", d)
	}
}

// The whole way: h1 copies web1's packet to db1 for h2's monitor mon2;
// what leaves h1's uplink is fed to h2's uplink, and mon2 receives exactly
// what db1 receives.
func TestPrivilegedACopyAcrossTheFabricArrivesAsTheOriginal(t *testing.T) {
	taps := []intent.TapRule{withFilter(rule(20, vm(web1), vm(db1), mon2, "h2"), 6, [2]uint16{}, [2]uint16{5432, 5432})}
	h1 := newHost(t, newLab(t, "up0", "vif-web3", "vif-mon1", "vif-mon4"), "h1", h1MAC, h1Desired(taps), map[netip.Addr]net.HardwareAddr{db1: h2MAC})
	l2 := newLab(t, "up0", "vif-db1", "vif-mon2")
	local := func(name string, a netip.Addr) intent.LocalEndpoint {
		return intent.LocalEndpoint{Name: "blue/x/" + name, IP: a.String(), MAC: vmac(a).String(), Interface: "vif-" + name}
	}
	d2 := intent.Desired{Node: "h2", VMNet: "10.0.0.0/8", Local: []intent.LocalEndpoint{local("db1", db1), local("mon2", mon2)},
		Visibility: []intent.VisRule{{SrcFarm: 1, SrcSubnet: 1, DstFarm: 1, DstSubnet: 2, Proto: 6, Port: 5432}}, Taps: taps}
	h2 := newHost(t, l2, "h2", h2MAC, d2, map[netip.Addr]net.HardwareAddr{web1: h1MAC})

	in := frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: layers.IPProtocolTCP, Sport: 40000, Dport: 5432}
	h1.lab.capture["up0"].drain(t)
	r := h1.run(t, h1.k.VifProgram(), in.bytes(t))
	up0 := uint32(h1.lab.ifindex["up0"])
	// Production leaves first (a clone), then the copy; the frame is
	// consumed.
	if r.Verdict != bpftest.ActStolen || r.To != 0 || fmt.Sprint(r.Clones) != fmt.Sprint([]uint32{up0, up0}) {
		t.Fatalf("h1: verdict %d to %d, clones %v; want production then one copy out of up0 (%d), frame consumed", r.Verdict, r.To, r.Clones, up0)
	}
	production, err := h1.lab.capture["up0"].next(2 * time.Second)
	if err != nil || production == nil {
		t.Fatalf("production never left h1's uplink (%v)", err)
	}
	if production[20]&0x80 != 0 {
		t.Fatalf("the first frame out of h1's uplink is marked: production must leave first, unmarked: %x", production[:34])
	}
	r.Out = production
	wire, err := h1.lab.capture["up0"].next(2 * time.Second)
	if err != nil || wire == nil {
		t.Fatalf("no copy left h1's uplink (%v)", err)
	}
	if wire[20]&0x80 == 0 || !bytes.Equal(wire[0:6], h2MAC) || !bytes.Equal(wire[6:12], h1MAC) || csum.Checksum(wire[14:34]) != 0 {
		t.Fatalf("the copy on the wire is not marked host to host with a valid checksum: %x", wire[:34])
	}
	// Production's frame, to db1 on h2, is what the receiver gets.
	prod := h2.run(t, h2.k.UplinkProgram(), r.Out)
	if prod.Verdict != bpftest.ActRedirect || prod.To != uint32(l2.ifindex["vif-db1"]) || prod.Kind != bpftest.RedirectPeer {
		t.Fatalf("h2: production verdict %d to %d", prod.Verdict, prod.To)
	}
	l2.capture["vif-mon2"].drain(t)
	got := h2.run(t, h2.k.UplinkProgram(), wire)
	if got.Verdict != bpftest.ActShot || got.To != 0 || fmt.Sprint(got.Clones) != fmt.Sprint([]uint32{uint32(l2.ifindex["vif-mon2"])}) {
		t.Fatalf("h2: copy verdict %d, to %d, copies %v", got.Verdict, got.To, got.Clones)
	}
	b, err := l2.capture["vif-mon2"].next(2 * time.Second)
	if err != nil || b == nil {
		t.Fatalf("mon2 received nothing (%v)", err)
	}
	if !bytes.Equal(b, prod.Out) {
		t.Fatalf("mon2 received\n%x\nwhat db1 receives is\n%x", b, prod.Out)
	}
	for name, h := range map[string]*host{"h1": h1, "h2": h2} {
		st := h.statsByID(t)[20]
		if st.Packets != 1 || st.Bytes != uint64(len(b)) || st.Dropped != 0 {
			t.Errorf("%s: rule 20 counted %+v", name, st)
		}
	}
}

func TestPrivilegedAMonitorThatCannotKeepUpLosesCopiesNotProduction(t *testing.T) {
	h := newH1(t)
	h.f.WithCopyRate(1, 1) // one a second, burst one: two at once, then none
	h.sync(t, h1Desired(h1Taps()), testNodes, func(n string) (int, error) {
		if n == "vif-web1" {
			return 1, nil
		}
		if i, ok := h.lab.ifindex[n]; ok {
			return i, nil
		}
		return 0, os.ErrNotExist
	})
	in := frame{Src: vmac(web1), Dst: vmac(web3), Saddr: web1, Daddr: web3, Proto: layers.IPProtocolTCP, Sport: 1, Dport: 80}
	before := h.statsByID(t)[1]
	copies := 0
	for i := 0; i < 5; i++ {
		r := h.run(t, h.k.VifProgram(), in.bytes(t))
		if r.Verdict != bpftest.ActRedirect || r.To != uint32(h.lab.ifindex["vif-web3"]) || r.Kind != bpftest.RedirectPeer {
			t.Fatalf("run %d: production verdict %d to %d", i, r.Verdict, r.To)
		}
		copies += len(r.Clones)
	}
	after := h.statsByID(t)[1]
	if copies != 2 || after.Packets-before.Packets != 2 || after.Dropped-before.Dropped != 3 {
		t.Fatalf("copies %d, counted %d, dropped %d: want 2, 2, 3", copies, after.Packets-before.Packets, after.Dropped-before.Dropped)
	}
}

// mapContents lists every non-zero entry of the TAP's maps.
func mapContents(t *testing.T, k *datapath.Kernel) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, name := range []string{MapRules, MapTargets, MapIndex, MapConfig, MapBuckets, MapStats} {
		m, err := k.Map(name)
		if err != nil {
			t.Fatal(err)
		}
		var key []byte
		var val []byte
		if m.Type() == ebpf.PerCPUArray {
			var per [][]byte
			it := m.Iterate()
			for it.Next(&key, &per) {
				for _, v := range per {
					if !bytes.Equal(v, make([]byte, len(v))) {
						out[name]++
						break
					}
				}
			}
			if err := it.Err(); err != nil {
				t.Fatal(err)
			}
			continue
		}
		it := m.Iterate()
		for it.Next(&key, &val) {
			if !bytes.Equal(val, make([]byte, len(val))) || m.Type() == ebpf.Hash {
				out[name]++
			}
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestPrivilegedAfterADeleteNothingIsLeftInAnyMap(t *testing.T) {
	h := newH1(t)
	ifx := func(n string) (int, error) {
		if i, ok := h.lab.ifindex[n]; ok {
			return i, nil
		}
		return 0, os.ErrNotExist
	}
	// Traffic first, so counters and buckets hold something.
	for _, f := range []frame{
		{Src: vmac(web1), Dst: vmac(web3), Saddr: web1, Daddr: web3, Proto: layers.IPProtocolTCP, Sport: 1, Dport: 80},
		{Src: vmac(web1), Dst: vmac(web2), Saddr: web1, Daddr: web2, Proto: layers.IPProtocolICMPv4},
	} {
		h.run(t, h.k.VifProgram(), f.bytes(t))
	}
	if got := mapContents(t, h.k); got[MapRules] != 10 || got[MapStats] == 0 || got[MapIndex] == 0 {
		t.Fatalf("before the delete: %v", got)
	}
	// One policy goes: its slot and counters with it, the rest stay.
	taps := h1Taps()
	keep := h.statsByID(t)[6]
	h.sync(t, h1Desired(taps[1:]), testNodes, ifx)
	st := h.statsByID(t)
	if _, ok := st[1]; ok || st[6] != keep {
		t.Fatalf("after deleting rule 1: %v (rule 6 was %+v)", st, keep)
	}
	// All go.
	h.sync(t, h1Desired(nil), testNodes, ifx)
	if got := mapContents(t, h.k); len(got) != 0 {
		t.Fatalf("after every policy's delete, left: %v", got)
	}
	if bits, _ := h.k.Features(); bits&datapath.FeatureTap != 0 {
		t.Fatal("the TAP's bit is still set")
	}
}

// captureOf is the capture on the far end of the host-side link ifindex.
func (l *lab) captureOf(ifindex uint32) (*packetSock, bool) {
	for name, i := range l.ifindex {
		if uint32(i) == ifindex {
			c, ok := l.capture[name]
			return c, ok
		}
	}
	return nil, false
}
