package portspace

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/csum"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/testenv"
)

const (
	actOK       = 0
	actShot     = 2
	actRedirect = 7
)

// Redirect kinds (enum redirect_kind, bpf/lib/redirect.h).
const (
	kindOut   = 1
	kindPeer  = 2
	kindClone = 3
	kindIn    = 4
)

var (
	upMAC   = mustMAC("aa:00:00:00:00:01") // h1's uplink: the slivers' MAC too
	peerMAC = mustMAC("aa:00:00:00:00:02") // the fabric's next hop
	evilMAC = mustMAC("aa:00:00:00:00:66")
	vifMAC  = mustMAC("02:00:00:00:00:01") // every host-side sliver link's own MAC (made up)
	public  = netip.MustParseAddr("192.0.2.10")
	public1 = netip.MustParseAddr("198.51.100.10") // h1's second uplink
	inet    = netip.MustParseAddr("192.0.2.99")
	other   = netip.MustParseAddr("192.0.2.11")
)

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

// BPF_PROG_RUN runs every program as if on lo (ifindex 1): the uplink is
// given ifindex 1, and the sliver a row sends from has its link on 1.
const (
	uplinkIf  = 1
	uplink1If = 9
	s1If      = 21
	s2If      = 22
	s2If1     = 23 // s2's link on uplink 1
	s3If      = 24
)

// testPlan is h1: s1 leases 10000-10099, s2 10100-10199 (and 20000-20009
// on uplink 1), s3 30000 alone; the rest is the host's. from names the
// slot whose uplink-0 link is ifindex 1 (the one BPF_PROG_RUN sends from).
func testPlan(from uint32) Plan {
	vif := func(slot uint32, ifindex int) int {
		if slot == from {
			return 1
		}
		return ifindex
	}
	return Plan{
		Uplinks: []Uplink{
			{Index: 0, Name: "uplink0", Ifindex: uplinkIf, Addr: public, MAC: upMAC},
			{Index: 1, Name: "uplink1", Ifindex: uplink1If, Addr: public1, MAC: upMAC},
		},
		Slivers: []Sliver{
			{Name: "s1", Slot: 1, Vifs: []Vif{{Uplink: 0, Name: "s0-s1", Ifindex: vif(1, s1If)}},
				Leases: []Lease{{Uplink: 0, Lo: 10000, Hi: 10099}}},
			{Name: "s2", Slot: 2, Vifs: []Vif{{Uplink: 0, Name: "s0-s2", Ifindex: vif(2, s2If)}, {Uplink: 1, Name: "s1-s2", Ifindex: s2If1}},
				Leases: []Lease{{Uplink: 0, Lo: 10100, Hi: 10199}, {Uplink: 1, Lo: 20000, Hi: 20009}}},
			{Name: "s3", Slot: 7, Vifs: []Vif{{Uplink: 0, Name: "s0-s3", Ifindex: vif(7, s3If)}},
				Leases: []Lease{{Uplink: 0, Lo: 30000, Hi: 30000}}},
		},
	}
}

// fakeLinks records what Sync attaches: the links of these tests are made up.
type fakeLinks struct {
	slivers map[string]int
	lo      bool
	cgroups string
}

func (l *fakeLinks) AttachSliver(name string, ifindex int) error {
	l.slivers[name] = ifindex
	return nil
}
func (l *fakeLinks) DetachSliver(name string) error { delete(l.slivers, name); return nil }
func (l *fakeLinks) SliverLinks() ([]string, error) {
	var out []string
	for n := range l.slivers {
		out = append(out, n)
	}
	return out, nil
}
func (l *fakeLinks) AttachLoopback() error                { l.lo = true; return nil }
func (l *fakeLinks) DetachLoopback() error                { l.lo = false; return nil }
func (l *fakeLinks) AttachSliverCgroups(dir string) error { l.cgroups = dir; return nil }
func (l *fakeLinks) DetachSliverCgroups() error           { l.cgroups = ""; return nil }

// router is what the tests read of the router's programs: the maps port
// space's share, its counters.
type router interface {
	Map(name string) (*ebpf.Map, error)
	Counters() (datapath.Counters, error)
}

// testKernel is the router's programs and port space's, loaded on the
// router's maps: its UplinkProgram, SliverProgram and LoopbackProgram are
// every program a frame of port space meets.
type testKernel struct {
	*datapath.Kernel
	ps *Kernel
}

func (k testKernel) SliverProgram() *ebpf.Program   { return k.ps.SliverProgram() }
func (k testKernel) LoopbackProgram() *ebpf.Program { return k.ps.LoopbackProgram() }

// loadKernels loads the router's and port space's programs, unpinned
// (testHooks: the builds that log every redirect).
func loadKernels(t testing.TB, testHooks bool) testKernel {
	t.Helper()
	testenv.RequireRoot(t, "BPF_PROG_RUN (unprivileged BPF is disabled on this machine)")
	fail := func(err error) {
		t.Helper()
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("load datapath: %v\nverifier log:\n%+v", err, ve)
		}
		t.Fatalf("load datapath: %v", err)
	}
	openRouter := func() (*datapath.Kernel, error) { return datapath.Open("", datapath.Options{}) }
	if testHooks {
		openRouter = datapath.OpenTestObjects
	}
	r, err := openRouter()
	if err != nil {
		fail(err)
	}
	t.Cleanup(func() { r.Close() }) // port space's with it
	ps, err := open(r, testHooks)
	if err != nil {
		fail(err)
	}
	return testKernel{r, ps}
}

func loadFeature(t testing.TB) (testKernel, *Feature, *fakeLinks) {
	t.Helper()
	k := loadKernels(t, true)
	// The router's node config: tenant space 10/8, port space on.
	cfg, err := k.Map("config")
	if err != nil {
		t.Fatal(err)
	}
	var nc datapath.NodeConfig
	nc.UplinkIfindex = uplinkIf
	copy(nc.UplinkMac[:], upMAC)
	nc.VmNet = datapath.IPKey(netip.MustParseAddr("10.0.0.0"))
	nc.VmMask = datapath.IPKey(netip.MustParseAddr("255.0.0.0"))
	nc.Features = datapath.FeaturePortspace
	if err := cfg.Put(uint32(0), nc); err != nil {
		t.Fatal(err)
	}
	f := New(k.Kernel)
	links := &fakeLinks{slivers: map[string]int{}}
	f.links = links
	f.vifMAC = func(int) (net.HardwareAddr, error) { return vifMAC, nil }
	return k, f, links
}

func syncPlan(t testing.TB, f *Feature, p Plan) {
	t.Helper()
	if err := f.Sync(p); err != nil {
		t.Fatalf("sync: %v", err)
	}
}

// frame is one test frame.
type frame struct {
	src, dst     net.HardwareAddr
	saddr, daddr netip.Addr
	proto        layers.IPProtocol
	sport, dport uint16
	icmpType     uint8 // with proto ICMP
	icmpCode     uint8
	icmpID       uint16
	quote        *frame // an ICMP error's quoted packet
	ipID         uint16
	fragOffset   uint16
	moreFrags    bool
	arpOp        uint16
	arpSHA       net.HardwareAddr
	ipv6         bool
	lo           bool // lo's header: zero MACs
}

func (f frame) ipBytes(t testing.TB) []byte {
	t.Helper()
	b := f.bytes(t)
	return b[14:]
}

func (f frame) bytes(t testing.TB) []byte {
	t.Helper()
	src, dst := f.src, f.dst
	if src == nil {
		src = upMAC
	}
	if dst == nil {
		dst = upMAC
	}
	if f.lo {
		src, dst = make(net.HardwareAddr, 6), make(net.HardwareAddr, 6)
	}
	eth := &layers.Ethernet{SrcMAC: src, DstMAC: dst, EthernetType: layers.EthernetTypeIPv4}
	ls := []gopacket.SerializableLayer{eth}
	payload := gopacket.Payload(bytes.Repeat([]byte{0xab}, 32))
	switch {
	case f.ipv6:
		eth.EthernetType = layers.EthernetTypeIPv6
		ls = append(ls, &layers.IPv6{Version: 6, NextHeader: layers.IPProtocolUDP, HopLimit: 64,
			SrcIP: net.ParseIP("fd00::1"), DstIP: net.ParseIP("fd00::2")}, payload)
	case f.arpOp != 0:
		eth.EthernetType = layers.EthernetTypeARP
		sha := f.arpSHA
		if sha == nil {
			sha = src
		}
		ls = append(ls, &layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4,
			HwAddressSize: 6, ProtAddressSize: 4, Operation: f.arpOp, SourceHwAddress: sha,
			SourceProtAddress: f.saddr.AsSlice(), DstHwAddress: make([]byte, 6), DstProtAddress: f.daddr.AsSlice()})
	default:
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: f.proto, SrcIP: f.saddr.AsSlice(), DstIP: f.daddr.AsSlice(),
			Id: f.ipID, FragOffset: f.fragOffset}
		if f.moreFrags {
			ip.Flags = layers.IPv4MoreFragments
		}
		ls = append(ls, ip)
		switch f.proto {
		case layers.IPProtocolTCP:
			tcp := &layers.TCP{SrcPort: layers.TCPPort(f.sport), DstPort: layers.TCPPort(f.dport), SYN: true, Window: 1000}
			tcp.SetNetworkLayerForChecksum(ip)
			ls = append(ls, tcp, payload)
		case layers.IPProtocolUDP:
			udp := &layers.UDP{SrcPort: layers.UDPPort(f.sport), DstPort: layers.UDPPort(f.dport)}
			udp.SetNetworkLayerForChecksum(ip)
			ls = append(ls, udp, payload)
		case layers.IPProtocolICMPv4:
			icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(f.icmpType, f.icmpCode), Id: f.icmpID, Seq: 1}
			if f.quote != nil {
				q := f.quote.ipBytes(t)
				hl := int(q[0]&0x0f) * 4
				ls = append(ls, icmp, gopacket.Payload(q[:hl+8]))
			} else {
				ls = append(ls, icmp, payload)
			}
		default:
			ls = append(ls, payload)
		}
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		t.Fatalf("build frame: %v", err)
	}
	b := append([]byte(nil), buf.Bytes()...)
	if f.fragOffset != 0 {
		// A later fragment: what follows the IPv4 header is payload,
		// not an L4 header (gopacket wrote one; its bytes stand in).
		return b
	}
	return b
}

type row struct {
	name    string
	prog    *ebpf.Program
	in      frame
	verdict uint32
	to      uint32 // where the frame went (redirect rows)
	kind    uint32 // kindOut, kindPeer, kindIn
	clones  []uint32
	drop    string // node drop counter that rises by one ("" none)
	// The slivers whose counters move, and how: "in", "out" or a drop
	// reason counted for it; every other counter stays.
	counts map[string]string
	// icmpID: the echo id the output frame carries (0: not checked);
	// wantDst: its destination MAC (nil: not checked).
	icmpID  uint16
	wantDst net.HardwareAddr
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

func statsBySliver(t testing.TB, f *Feature) map[string]intent.SliverStats {
	t.Helper()
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]intent.SliverStats{}
	for _, s := range st {
		out[s.Name] = s
	}
	return out
}

func run(t *testing.T, k router, f *Feature, rows []row) {
	t.Helper()
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			logm := redirectLog(t, r.prog)
			if err := logm.Put(uint32(0), trace{}); err != nil {
				t.Fatal(err)
			}
			before, err := k.Counters()
			if err != nil {
				t.Fatal(err)
			}
			sb := statsBySliver(t, f)
			in := r.in.bytes(t)
			opts := &ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+64)}
			ret, err := r.prog.Run(opts)
			if err != nil {
				t.Fatalf("BPF_PROG_RUN: %v", err)
			}
			if ret != r.verdict {
				t.Fatalf("verdict %d, want %d", ret, r.verdict)
			}
			var tr trace
			if err := logm.Lookup(uint32(0), &tr); err != nil {
				t.Fatal(err)
			}
			var clones []uint32
			var to, kind uint32
			n := 0
			for i := 0; i < int(tr.Count) && i < 8; i++ {
				if tr.Kind[i] == kindClone {
					clones = append(clones, tr.Ifindex[i])
					continue
				}
				to, kind = tr.Ifindex[i], tr.Kind[i]
				n++
			}
			if fmt.Sprint(clones) != fmt.Sprint(r.clones) {
				t.Errorf("copies to %v, want %v", clones, r.clones)
			}
			if r.verdict == actRedirect {
				if n != 1 || to != r.to || kind != r.kind {
					t.Errorf("redirected %d times, last to %d (kind %d), want once to %d (kind %d)", n, to, kind, r.to, r.kind)
				}
			} else if n != 0 {
				t.Errorf("verdict %d but redirected to %d", ret, to)
			}
			out := opts.DataOut
			if r.wantDst != nil && !bytes.Equal(out[:6], r.wantDst) {
				t.Errorf("destination MAC %s, want %s", net.HardwareAddr(out[:6]), r.wantDst)
			}
			if r.icmpID != 0 {
				hl := int(out[14]&0x0f) * 4
				icmp := out[14+hl:]
				if r.in.quote != nil {
					qhl := int(icmp[8]&0x0f) * 4
					icmp = icmp[8+qhl:]
				}
				if id := binary.BigEndian.Uint16(icmp[4:6]); id != r.icmpID {
					t.Errorf("echo id %d, want %d", id, r.icmpID)
				}
				whole := out[14+hl : 14+int(binary.BigEndian.Uint16(out[16:18]))]
				if sum := csum.Checksum(whole); sum != 0 {
					t.Errorf("ICMP checksum does not verify (%#04x)", sum)
				}
			}
			after, err := k.Counters()
			if err != nil {
				t.Fatal(err)
			}
			for name, v := range after.Drops {
				d := v - before.Drops[name]
				if (name == r.drop && d != 1) || (name != r.drop && d != 0) {
					t.Errorf("drop counter %s rose by %d", name, d)
				}
			}
			if _, ok := after.Drops[r.drop]; r.drop != "" && !ok {
				t.Errorf("no drop counter %s", r.drop)
			}
			sa := statsBySliver(t, f)
			for name, a := range sa {
				b := sb[name]
				want := func(what string) uint64 {
					if r.counts[name] == what {
						return 1
					}
					return 0
				}
				if d := a.PacketsIn - b.PacketsIn; d != want("in") {
					t.Errorf("%s: packets in rose by %d", name, d)
				}
				if d := a.PacketsOut - b.PacketsOut; d != want("out") {
					t.Errorf("%s: packets out rose by %d", name, d)
				}
				for reason, v := range a.Drops {
					if d := v - b.Drops[reason]; d != want(reason) {
						t.Errorf("%s: drop %s rose by %d", name, reason, d)
					}
				}
				if c := r.counts[name]; c != "" && c != "in" && c != "out" && a.Drops[c] == b.Drops[c] {
					t.Errorf("%s: drop %s not counted", name, c)
				}
			}
		})
	}
}
