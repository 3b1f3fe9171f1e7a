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
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/csum"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ipam"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/testenv"
)

// The BPF_PROG_RUN tests run in a namespace of their own with real veth
// pairs for the uplink and the monitors' vifs: bpf_clone_redirect sends a
// copy at once, so each copy is read, whole, by a packet socket on the far
// end, as the monitor VM (or the fabric) would receive it.

const (
	actOK       = 0
	actShot     = 2
	actRedirect = 7
	actStolen   = 4
	kindOut     = 1
	kindPeer    = 2
	kindClone   = 3
)

var (
	h1MAC    = mustMAC("aa:00:00:00:00:01")
	h2MAC    = mustMAC("aa:00:00:00:00:02")
	h3MAC    = mustMAC("aa:00:00:00:00:03")
	rogueMAC = mustMAC("aa:00:00:00:00:99")

	web3 = netip.MustParseAddr("10.1.1.4")  // local on h1, a receiver
	mon4 = netip.MustParseAddr("10.1.1.12") // local on h1, a second monitor
	mon5 = netip.MustParseAddr("10.1.1.13") // on h3
	mon6 = netip.MustParseAddr("10.1.1.14") // on h2, beside mon2
	far  = netip.MustParseAddr("10.1.1.77") // remote, not mapped yet
)

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func vmac(a netip.Addr) net.HardwareAddr { return ipam.VirtualMAC(a) }

// lab is one host's datapath in a namespace of its own: its links, and a
// packet socket on the far end of each.
type lab struct {
	ns      string
	ifindex map[string]int         // host-side links by name
	capture map[string]*packetSock // by host-side link name
}

var labs int

// newLab makes the namespace with a veth pair per name (NAME on the host's
// side, NAME-p on the far side, both up) and a capture on each far end.
func newLab(t testing.TB, names ...string) *lab {
	t.Helper()
	testenv.RequireRoot(t, "BPF_PROG_RUN and namespaces")
	labs++
	l := &lab{ns: fmt.Sprintf("taptest-%d-%d", os.Getpid(), labs), ifindex: map[string]int{}, capture: map[string]*packetSock{}}
	if err := netns.Create(l.ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netns.Delete(l.ns); err != nil {
			t.Error(err)
		}
	})
	h, err := netns.Handle(l.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, n := range names {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: n}, PeerName: n + "-p"}
		if err := h.LinkAdd(v); err != nil {
			t.Fatalf("veth %s: %v", n, err)
		}
		for _, end := range []string{n, n + "-p"} {
			link, err := h.LinkByName(end)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.LinkSetUp(link); err != nil {
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

// frame is one test frame.
type frame struct {
	src, dst     net.HardwareAddr
	saddr, daddr netip.Addr
	proto        layers.IPProtocol
	sport, dport uint16
	ttl          uint8
	marked       bool // the reserved flag set (checksum computed with it)
	payload      string
}

func (f frame) bytes(t testing.TB) []byte {
	t.Helper()
	ttl := f.ttl
	if ttl == 0 {
		ttl = 64
	}
	ip := &layers.IPv4{Version: 4, TTL: ttl, Protocol: f.proto, SrcIP: f.saddr.AsSlice(), DstIP: f.daddr.AsSlice(), Id: 7}
	if f.marked {
		ip.Flags = layers.IPv4EvilBit // RFC 3514's name for the reserved bit
	}
	payload := gopacket.Payload(f.payload)
	if f.payload == "" {
		payload = gopacket.Payload("the tapped payload, 32 bytes....")
	}
	ls := []gopacket.SerializableLayer{&layers.Ethernet{SrcMAC: f.src, DstMAC: f.dst, EthernetType: layers.EthernetTypeIPv4}, ip}
	switch f.proto {
	case layers.IPProtocolTCP:
		tcp := &layers.TCP{SrcPort: layers.TCPPort(f.sport), DstPort: layers.TCPPort(f.dport), SYN: true, Window: 1000}
		tcp.SetNetworkLayerForChecksum(ip)
		ls = append(ls, tcp)
	case layers.IPProtocolUDP:
		udp := &layers.UDP{SrcPort: layers.UDPPort(f.sport), DstPort: layers.UDPPort(f.dport)}
		udp.SetNetworkLayerForChecksum(ip)
		ls = append(ls, udp)
	case layers.IPProtocolICMPv4:
		ls = append(ls, &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(8, 0), Id: 3, Seq: 1})
	}
	ls = append(ls, payload)
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
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
	h := &host{name: name, k: k, f: New(k), lab: l}
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
	p, err := Compile(feature.Node{Name: h.name, Desired: d, Nodes: nodes, Ifindex: ifindexOf, UplinkIfindex: h.lab.ifindex["up0"]})
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

type trace struct {
	Count   uint32
	Ifindex [8]uint32
	Kind    [8]uint32
}

func redirectLog(t testing.TB, prog *ebpf.Program) *ebpf.Map {
	t.Helper()
	info, err := prog.Info()
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := info.MapIDs()
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			t.Fatal(err)
		}
		if mi, err := m.Info(); err == nil && mi.Name == "redirect_log" {
			t.Cleanup(func() { m.Close() })
			return m
		}
		m.Close()
	}
	t.Fatal("no redirect_log: not a test object")
	return nil
}

// result is what one run of a program did.
type result struct {
	verdict uint32
	out     []byte
	to      uint32 // the production redirect (0: none)
	kind    uint32
	clones  []uint32
}

// run runs prog on in inside the lab's namespace (where the copies'
// devices are).
func (h *host) run(t testing.TB, prog *ebpf.Program, in []byte) result {
	t.Helper()
	logm := redirectLog(t, prog)
	if err := logm.Put(uint32(0), trace{}); err != nil {
		t.Fatal(err)
	}
	var r result
	err := netns.Do(h.lab.ns, func() error {
		opts := &ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+256)}
		ret, err := prog.Run(opts)
		if err != nil {
			return fmt.Errorf("BPF_PROG_RUN: %w", err)
		}
		r.verdict, r.out = ret, opts.DataOut
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var tr trace
	if err := logm.Lookup(uint32(0), &tr); err != nil {
		t.Fatal(err)
	}
	if tr.Count > 8 {
		t.Fatalf("%d redirects: more than the log holds", tr.Count)
	}
	for i := 0; i < int(tr.Count); i++ {
		if tr.Kind[i] == kindClone {
			r.clones = append(r.clones, tr.Ifindex[i])
			continue
		}
		if r.to != 0 {
			t.Fatalf("redirected twice: to %d and %d", r.to, tr.Ifindex[i])
		}
		r.to, r.kind = tr.Ifindex[i], tr.Kind[i]
	}
	return r
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
			before, sb := h.counters(t), h.statsByID(t)
			got := h.run(t, prog, in)
			after, sa := h.counters(t), h.statsByID(t)
			// Bound for the uplink with copies due, production leaves
			// first as a clone (so it queues ahead of its copies) and the
			// frame is consumed: that first clone is production, and it
			// must reach its link before any copy, as it was.
			if got.verdict == actStolen {
				if len(got.clones) == 0 {
					t.Fatalf("frame consumed, but nothing sent")
				}
				got.to, got.kind, got.verdict, got.clones = got.clones[0], kindOut, actRedirect, got.clones[1:]
				c, ok := h.lab.captureOf(got.to)
				if !ok {
					t.Fatalf("production left by link %d, which has no capture to check it on", got.to)
				}
				{
					b, err := c.next(2 * time.Second)
					if err != nil {
						t.Fatal(err)
					}
					if b == nil {
						t.Fatalf("production never arrived on link %d", got.to)
					}
					if len(b) > len(base.out) || !bytes.Equal(b, base.out[:len(b)]) {
						t.Errorf("the first frame out of %d is not production as it was:\n got %x\nwant %x", got.to, b, base.out[:len(b)])
					}
				}
				// The consumed frame's own bytes went nowhere; what left
				// was just checked.
				got.out = base.out
			}

			// Production: as without the TAP, and as the row says.
			sameBytes := base.verdict == actShot || bytes.Equal(got.out, base.out) // a dropped frame's bytes go nowhere
			if got.verdict != base.verdict || got.to != base.to || got.kind != base.kind || !sameBytes {
				t.Errorf("production changed by the TAP: verdict %d to %d (kind %d), want %d to %d (kind %d); bytes equal: %v",
					got.verdict, got.to, got.kind, base.verdict, base.to, base.kind, bytes.Equal(got.out, base.out))
			}
			if len(base.clones) != 0 {
				t.Errorf("copies with the TAP off: %v", base.clones)
			}
			if got.verdict != r.verdict {
				t.Fatalf("verdict %d, want %d", got.verdict, r.verdict)
			}
			if r.to != "" && got.to != h.linkIndex(r.to) {
				t.Errorf("production went to %d, want %s (%d)", got.to, r.to, h.linkIndex(r.to))
			}
			// The copies: where (the redirect log), and what arrived.
			var wantClones []uint32
			for _, c := range r.copies {
				wantClones = append(wantClones, h.linkIndex(c.link))
			}
			if fmt.Sprint(got.clones) != fmt.Sprint(wantClones) {
				t.Errorf("copies to %v, want %v", got.clones, wantClones)
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
			for name, n := range after.Drops {
				d := n - before.Drops[name]
				if (name == r.drop) != (d == 1) || d > 1 {
					t.Errorf("drop counter %s rose by %d", name, d)
				}
			}
			if _, ok := after.Drops[r.drop]; r.drop != "" && !ok {
				t.Errorf("no drop counter %s", r.drop)
			}
			for _, name := range []string{"tap_copy_local", "tap_copy_remote", "tap_copy_recovered"} {
				if _, ok := after.Forwards[name]; !ok {
					t.Errorf("no forward counter %s", name)
				}
				if d := after.Forwards[name] - before.Forwards[name]; d != r.forward[name] {
					t.Errorf("forward counter %s rose by %d, want %d", name, d, r.forward[name])
				}
			}
			for id, a := range sa {
				b := sb[id]
				wantP, wantD := uint64(0), uint64(0)
				for _, c := range r.copied {
					if c == id {
						wantP = 1
					}
				}
				for _, c := range r.dropped {
					if c == id {
						wantD = 1
					}
				}
				if a.Packets-b.Packets != wantP || a.Bytes-b.Bytes != wantP*uint64(len(in)) || a.Dropped-b.Dropped != wantD {
					t.Errorf("rule %d: packets +%d, bytes +%d, dropped +%d; want +%d, +%d, +%d", id,
						a.Packets-b.Packets, a.Bytes-b.Bytes, a.Dropped-b.Dropped, wantP, wantP*uint64(len(in)), wantD)
				}
			}
		})
	}
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
		return frame{src: vmac(web1), dst: vmac(dst), saddr: web1, daddr: dst, proto: proto, sport: sport, dport: dport}
	}
	routed := from(db1, tcp, 40000, 5432)
	routed.dst = vmac(gw)
	local := func(f frame) []byte { return asSeen(f.bytes(t)) } // what web3 (or the monitor) gets
	// What production sends to h2, with TTL one less when routed.
	toFabric := func(f frame, hop bool) frame {
		if hop {
			f.ttl = 63
		}
		f.src, f.dst = h1MAC, h2MAC
		return f
	}
	remoteCopy := func(f frame, hostMAC net.HardwareAddr) []byte {
		return marked(f.bytes(t), h1MAC, hostMAC)
	}
	fabricLocal := func(f frame) []byte { return asSeen(f.bytes(t)) }
	one := func(n string) map[string]uint64 { return map[string]uint64{n: 1} }

	h.runRows(t, h.k.VifProgram(), []row{
		{name: "vm to local vm, any protocol: one copy into the local monitor, as the receiver sees it",
			in: from(web3, tcp, 40000, 80), verdict: actRedirect, to: "vif-web3",
			copies: []copyWant{{"vif-mon1", local(from(web3, tcp, 40000, 80))}}, forward: one("tap_copy_local"), copied: []uint32{1}},
		{name: "two rules, one monitor: one copy, both rules count it",
			in: from(web3, udp, 5000, 53), verdict: actRedirect, to: "vif-web3",
			copies: []copyWant{{"vif-mon1", local(from(web3, udp, 5000, 53))}}, forward: one("tap_copy_local"), copied: []uint32{1, 3}},
		{name: "source port range: its upper end matches",
			in: from(web2, udp, 5001, 53), verdict: actRedirect, to: "up0",
			copies: []copyWant{{"vif-mon1", fabricLocal(toFabric(from(web2, udp, 5001, 53), false))}}, forward: one("tap_copy_local"), copied: []uint32{3}},
		{name: "source port range: one past it does not",
			in: from(web2, udp, 5002, 53), verdict: actRedirect, to: "up0"},
		{name: "remote receiver, remote monitor: one marked copy to its host, host MAC to host MAC",
			in: from(web2, tcp, 40000, 80), verdict: actRedirect, to: "up0",
			copies: []copyWant{{"up0", remoteCopy(toFabric(from(web2, tcp, 40000, 80), false), h2MAC)}}, forward: one("tap_copy_remote"), copied: []uint32{2}},
		{name: "destination port filter: another port is not copied",
			in: from(web2, tcp, 40000, 81), verdict: actRedirect, to: "up0"},
		{name: "protocol filter: udp to the tcp rule's port is not copied",
			in: from(web2, udp, 40000, 80), verdict: actRedirect, to: "up0"},
		{name: "two monitors on this host: two copies",
			in: from(web2, udp, 5000, 9000), verdict: actRedirect, to: "up0",
			copies: []copyWant{
				{"vif-mon1", fabricLocal(toFabric(from(web2, udp, 5000, 9000), false))},
				{"vif-mon4", fabricLocal(toFabric(from(web2, udp, 5000, 9000), false))}},
			forward: map[string]uint64{"tap_copy_local": 2}, copied: []uint32{3, 4}},
		{name: "routed: the copy has the hop the receiver sees, to h3's monitor",
			in: routed, verdict: actRedirect, to: "up0",
			copies:  []copyWant{{"up0", remoteCopy(toFabric(routed, true), h3MAC)}},
			forward: one("tap_copy_remote"), copied: []uint32{5}},
		{name: "three rules, two monitor hosts: one copy per host",
			in: from(web2, icmp, 0, 0), verdict: actRedirect, to: "up0",
			copies: []copyWant{
				{"up0", remoteCopy(toFabric(from(web2, icmp, 0, 0), false), h2MAC)},
				{"up0", remoteCopy(toFabric(from(web2, icmp, 0, 0), false), h3MAC)}},
			forward: map[string]uint64{"tap_copy_remote": 2}, copied: []uint32{6, 8, 9}},
		{name: "not admitted: nothing copied",
			in: from(db1, tcp, 40000, 80), verdict: actShot, drop: "not_visible"},
		{name: "a VM's frame carrying the copy marker is dropped, never copied",
			in:      frame{src: vmac(web1), dst: vmac(web3), saddr: web1, daddr: web3, proto: tcp, sport: 1, dport: 80, marked: true},
			verdict: actShot, drop: "reserved_flag"},
	})
}

// gw is web's gateway.
var gw = netip.MustParseAddr("10.1.1.1")

func TestPrivilegedHeldPacketsAreCopiedToo(t *testing.T) {
	h := newH1(t)
	in := frame{src: vmac(web1), dst: vmac(far), saddr: web1, daddr: far, proto: layers.IPProtocolICMPv4}
	// Held for the agent while it resolves far; its copy is made now.
	out := in
	out.src, out.dst = h1MAC, h2MAC
	h.runRows(t, h.k.VifProgram(), []row{{name: "held", in: in, verdict: actShot,
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
		return frame{src: vmac(src), dst: vmac(dst), saddr: src, daddr: dst, proto: proto, sport: 40000, dport: 53}
	}
	seen := func(f frame) []byte { return asSeen(f.bytes(t)) }
	copyOf := func(f frame, from, to net.HardwareAddr) frame {
		f.marked, f.src, f.dst = true, from, to
		return f
	}
	one := func(n string) map[string]uint64 { return map[string]uint64{n: 1} }
	h.runRows(t, h.k.UplinkProgram(), []row{
		{name: "a copy for a local monitor: restored, to it alone, never to its local receiver",
			in: copyOf(orig(web2, web3, tcp), h2MAC, h1MAC), verdict: actShot,
			copies: []copyWant{{"vif-mon1", seen(orig(web2, web3, tcp))}}, forward: one("tap_copy_recovered"), copied: []uint32{10}},
		{name: "the same packet unmarked is production: delivered, not copied here",
			in: frame{src: h2MAC, dst: h1MAC, saddr: web2, daddr: web3, proto: tcp, sport: 40000, dport: 53}, verdict: actRedirect, to: "vif-web3"},
		{name: "a VLAN rule: a sender of its segment",
			in: copyOf(orig(db1, web1, udp), h2MAC, h1MAC), verdict: actShot,
			copies: []copyWant{{"vif-mon1", seen(orig(db1, web1, udp))}}, forward: one("tap_copy_recovered"), copied: []uint32{7}},
		{name: "a VLAN rule: a sender of another segment is no copy anyone here wants",
			in: copyOf(orig(web2, web1, udp), h2MAC, h1MAC), verdict: actShot, drop: "tap_copy_unknown"},
		{name: "a copy a local rule's filters refuse",
			in: copyOf(orig(db1, web1, tcp), h2MAC, h1MAC), verdict: actShot, drop: "tap_copy_unknown"},
		{name: "a copy from a MAC that is no host's",
			in: copyOf(orig(web2, web3, tcp), rogueMAC, h1MAC), verdict: actShot, drop: "fabric_unknown_host"},
		{name: "a copy from the wrong host for its sender",
			in: copyOf(orig(web2, web3, tcp), h3MAC, h1MAC), verdict: actShot, drop: "fabric_unknown_src"},
		{name: "a copy flooded towards another host",
			in: copyOf(orig(web2, web3, tcp), h2MAC, h3MAC), verdict: actShot, drop: "tap_copy_unknown"},
	})
}

func TestPrivilegedACopyIsDroppedWhereNoRuleIsInUse(t *testing.T) {
	h := newH1(t)
	h.sync(t, h1Desired(nil), testNodes, func(string) (int, error) { return 0, os.ErrNotExist })
	in := frame{src: h2MAC, dst: h1MAC, saddr: web2, daddr: web3, proto: layers.IPProtocolTCP, sport: 1, dport: 2, marked: true}
	r := h.run(t, h.k.UplinkProgram(), in.bytes(t))
	if r.verdict != actShot || r.to != 0 || len(r.clones) != 0 {
		t.Fatalf("a copy on a node without TAP: verdict %d, to %d, copies %v; want dropped", r.verdict, r.to, r.clones)
	}
	vm := frame{src: vmac(web1), dst: vmac(web3), saddr: web1, daddr: web3, proto: layers.IPProtocolTCP, sport: 1, dport: 2, marked: true}
	before := h.counters(t)
	if r := h.run(t, h.k.VifProgram(), vm.bytes(t)); r.verdict != actShot || r.to != 0 {
		t.Fatalf("a VM's marked frame on a node without TAP: verdict %d, to %d", r.verdict, r.to)
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

	in := frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db1, proto: layers.IPProtocolTCP, sport: 40000, dport: 5432}
	h1.lab.capture["up0"].drain(t)
	r := h1.run(t, h1.k.VifProgram(), in.bytes(t))
	up0 := uint32(h1.lab.ifindex["up0"])
	// Production leaves first (a clone), then the copy; the frame is
	// consumed.
	if r.verdict != actStolen || r.to != 0 || fmt.Sprint(r.clones) != fmt.Sprint([]uint32{up0, up0}) {
		t.Fatalf("h1: verdict %d to %d, clones %v; want production then one copy out of up0 (%d), frame consumed", r.verdict, r.to, r.clones, up0)
	}
	production, err := h1.lab.capture["up0"].next(2 * time.Second)
	if err != nil || production == nil {
		t.Fatalf("production never left h1's uplink (%v)", err)
	}
	if production[20]&0x80 != 0 {
		t.Fatalf("the first frame out of h1's uplink is marked: production must leave first, unmarked: %x", production[:34])
	}
	r.out = production
	wire, err := h1.lab.capture["up0"].next(2 * time.Second)
	if err != nil || wire == nil {
		t.Fatalf("no copy left h1's uplink (%v)", err)
	}
	if wire[20]&0x80 == 0 || !bytes.Equal(wire[0:6], h2MAC) || !bytes.Equal(wire[6:12], h1MAC) || csum.Checksum(wire[14:34]) != 0 {
		t.Fatalf("the copy on the wire is not marked host to host with a valid checksum: %x", wire[:34])
	}
	// Production's frame, to db1 on h2, is what the receiver gets.
	prod := h2.run(t, h2.k.UplinkProgram(), r.out)
	if prod.verdict != actRedirect || prod.to != uint32(l2.ifindex["vif-db1"]) || prod.kind != kindPeer {
		t.Fatalf("h2: production verdict %d to %d", prod.verdict, prod.to)
	}
	l2.capture["vif-mon2"].drain(t)
	got := h2.run(t, h2.k.UplinkProgram(), wire)
	if got.verdict != actShot || got.to != 0 || fmt.Sprint(got.clones) != fmt.Sprint([]uint32{uint32(l2.ifindex["vif-mon2"])}) {
		t.Fatalf("h2: copy verdict %d, to %d, copies %v", got.verdict, got.to, got.clones)
	}
	b, err := l2.capture["vif-mon2"].next(2 * time.Second)
	if err != nil || b == nil {
		t.Fatalf("mon2 received nothing (%v)", err)
	}
	if !bytes.Equal(b, prod.out) {
		t.Fatalf("mon2 received\n%x\nwhat db1 receives is\n%x", b, prod.out)
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
	in := frame{src: vmac(web1), dst: vmac(web3), saddr: web1, daddr: web3, proto: layers.IPProtocolTCP, sport: 1, dport: 80}
	before := h.statsByID(t)[1]
	copies := 0
	for i := 0; i < 5; i++ {
		r := h.run(t, h.k.VifProgram(), in.bytes(t))
		if r.verdict != actRedirect || r.to != uint32(h.lab.ifindex["vif-web3"]) || r.kind != kindPeer {
			t.Fatalf("run %d: production verdict %d to %d", i, r.verdict, r.to)
		}
		copies += len(r.clones)
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
		{src: vmac(web1), dst: vmac(web3), saddr: web1, daddr: web3, proto: layers.IPProtocolTCP, sport: 1, dport: 80},
		{src: vmac(web1), dst: vmac(web2), saddr: web1, daddr: web2, proto: layers.IPProtocolICMPv4},
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
