package portspace

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/csum"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/testenv"
)

var (
	upMAC   = bpftest.MustMAC("aa:00:00:00:00:01") // h1's uplink: the slivers' MAC too
	peerMAC = bpftest.MustMAC("aa:00:00:00:00:02") // the fabric's next hop
	evilMAC = bpftest.MustMAC("aa:00:00:00:00:66")
	vifMAC  = bpftest.MustMAC("02:00:00:00:00:01") // every host-side sliver link's own MAC (made up)
	public  = netip.MustParseAddr("192.0.2.10")
	public1 = netip.MustParseAddr("198.51.100.10") // h1's second uplink
	inet    = netip.MustParseAddr("192.0.2.99")
	other   = netip.MustParseAddr("192.0.2.11")
)

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

// row is one table row of port space: the frame in, what becomes of it,
// and the counters that move: the node's drop counters and every sliver's.
type row struct {
	name    string
	prog    *ebpf.Program
	in      bpftest.Frame
	verdict uint32
	to      uint32               // where the frame went (redirect rows)
	kind    bpftest.RedirectKind // how: out, into the peer, in
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

func run(t *testing.T, k router, f *Feature, rows []row) {
	t.Helper()
	table := make([]bpftest.Row, len(rows))
	for i, r := range rows {
		want := bpftest.Counters{}
		if r.drop != "" {
			want["drop "+r.drop] = 1
		}
		for sliver, what := range r.counts {
			if what != "in" && what != "out" {
				what = "drop " + what
			}
			want[sliver+" "+what] = 1
		}
		table[i] = bpftest.Row{Name: r.name, Prog: r.prog, In: r.in.Bytes(t), Verdict: r.verdict, To: r.to, Kind: r.kind,
			Clones: r.clones, Counters: want, Check: r.checkOut}
	}
	bpftest.RunTable(t, func(t testing.TB) bpftest.Counters {
		t.Helper()
		c, err := k.Counters()
		if err != nil {
			t.Fatal(err)
		}
		st, err := f.Stats()
		if err != nil {
			t.Fatal(err)
		}
		out := bpftest.Counters{}.Add("drop", c.Drops)
		for _, s := range st {
			out[s.Name+" in"], out[s.Name+" out"] = s.PacketsIn, s.PacketsOut
			out.Add(s.Name+" drop", s.Drops)
		}
		return out
	}, table)
}

// checkOut checks what the row says of the frame out: its destination MAC,
// and the echo id it carries with an ICMP checksum that verifies.
func (r row) checkOut(t *testing.T, out []byte) {
	t.Helper()
	if r.wantDst != nil && !bytes.Equal(out[:6], r.wantDst) {
		t.Errorf("destination MAC %s, want %s", net.HardwareAddr(out[:6]), r.wantDst)
	}
	if r.icmpID != 0 {
		hl := int(out[14]&0x0f) * 4
		icmp := out[14+hl:]
		if r.in.Quote != nil {
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
}
