package portspace

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lease"
	"github.com/onehop/onehop/internal/limits"
)

var (
	mac0 = net.HardwareAddr{0xaa, 0, 0, 0, 0, 1}
	mac1 = net.HardwareAddr{0xaa, 0, 0, 0, 1, 1}
)

// node is h1 with two uplinks (index 1 multi-homed) and the given
// slivers; links lists the interfaces that exist, by name.
func node(slivers []intent.LocalSliver, links map[string]int) feature.Node {
	return feature.Node{
		Name:    "h1",
		Desired: intent.Desired{Node: "h1", Slivers: slivers},
		Uplinks: []feature.Uplink{
			{Index: 1, Name: "uplink1", Ifindex: 3, MAC: mac1, Addr: netip.MustParseAddr("192.168.100.20"), Bits: 24},
			{Index: 0, Name: "uplink0", Ifindex: 2, MAC: mac0, Addr: netip.MustParseAddr("192.168.100.10"), Bits: 24},
		},
		Ifindex: func(name string) (int, error) {
			if i, ok := links[name]; ok {
				return i, nil
			}
			return 0, fmt.Errorf("link %s not found", name)
		},
	}
}

func local(name string, slot uint32, leases string) intent.LocalSliver {
	ls, err := lease.Parse(leases)
	if err != nil {
		panic(err)
	}
	return intent.LocalSliver{Name: name, Slot: slot, Leases: ls}
}

func TestCompileGivesEverySliverItsVifsAndLeasesBySlot(t *testing.T) {
	n := node([]intent.LocalSliver{
		local("s2", 2, "10100-10199"),
		local("s1", 1, "10000-10099,1:20000-20099"),
	}, map[string]int{"s0-s1": 11, "s1-s1": 12, "s0-s2": 13})
	p, err := Compile(n)
	if err != nil {
		t.Fatal(err)
	}
	want := Plan{
		Uplinks: []Uplink{
			{Index: 0, Name: "uplink0", Ifindex: 2, Addr: netip.MustParseAddr("192.168.100.10"), MAC: mac0},
			{Index: 1, Name: "uplink1", Ifindex: 3, Addr: netip.MustParseAddr("192.168.100.20"), MAC: mac1},
		},
		Slivers: []Sliver{
			{Name: "s1", Slot: 1, Vifs: []Vif{{Uplink: 0, Name: "s0-s1", Ifindex: 11}, {Uplink: 1, Name: "s1-s1", Ifindex: 12}},
				Leases: []Lease{{Uplink: 0, Lo: 10000, Hi: 10099}, {Uplink: 1, Lo: 20000, Hi: 20099}}},
			{Name: "s2", Slot: 2, Vifs: []Vif{{Uplink: 0, Name: "s0-s2", Ifindex: 13}},
				Leases: []Lease{{Uplink: 0, Lo: 10100, Hi: 10199}}},
		},
	}
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("plan\n%+v\nwant\n%+v", p, want)
	}
	wantSizes := feature.Sizes{"portspace_uplinks": 2, "portspace_addrs": 2, "portspace_ports": 300, "portspace_slivers": 2, "portspace_vifs": 3, "portspace_fanout": 3, "portspace_cgroups": 2}
	if got := p.Sizes(); !reflect.DeepEqual(got, wantSizes) {
		t.Fatalf("sizes %v, want %v", got, wantSizes)
	}
	if !p.InUse() {
		t.Fatal("plan with slivers is not in use")
	}
	// Deterministic: the same node in another order gives the same plan.
	n.Desired.Slivers[0], n.Desired.Slivers[1] = n.Desired.Slivers[1], n.Desired.Slivers[0]
	if again, err := Compile(n); err != nil || !reflect.DeepEqual(again, p) {
		t.Fatalf("recompiled: %+v, %v", again, err)
	}
}

func TestCompileLeavesOutASliverWhoseLinkIsMissing(t *testing.T) {
	// s1 leases on both uplinks but only its uplink-0 link exists.
	n := node([]intent.LocalSliver{
		local("s1", 1, "10000-10099,1:20000-20099"),
		local("s2", 2, "10100-10199"),
		local("s3", 3, "10200-10299"),
	}, map[string]int{"s0-s1": 11, "s0-s2": 13})
	p, err := Compile(n)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Slivers) != 1 || p.Slivers[0].Name != "s2" {
		t.Fatalf("slivers %+v, want only s2", p.Slivers)
	}
	want := []MissingVif{{Sliver: "s1", Ifname: "s1-s1"}, {Sliver: "s3", Ifname: "s0-s3"}}
	if !reflect.DeepEqual(p.Missing, want) {
		t.Fatalf("missing %+v, want %+v", p.Missing, want)
	}
	if got := p.Sizes()["portspace_ports"]; got != 100 {
		t.Fatalf("portspace_ports %d, want 100 (only s2's)", got)
	}
}

func TestCompileWithoutSliversIsNotInUse(t *testing.T) {
	p, err := Compile(node(nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	if p.InUse() || len(p.Uplinks) != 2 {
		t.Fatalf("plan %+v: want 2 uplinks and not in use", p)
	}
	for m, v := range p.Sizes() {
		if v != 0 && m != "portspace_uplinks" && m != "portspace_addrs" {
			t.Errorf("%s: %d entries, want 0", m, v)
		}
	}
	// Every link missing: nothing in use, everything listed.
	p, err = Compile(node([]intent.LocalSliver{local("s1", 1, "10000")}, nil))
	if err != nil || p.InUse() || len(p.Missing) != 1 {
		t.Fatalf("plan %+v, %v: want s1 missing and not in use", p, err)
	}
}

func TestCompileSkipsUplinksWithoutIPv4(t *testing.T) {
	n := node([]intent.LocalSliver{local("s1", 1, "1:20000")}, map[string]int{"s1-s1": 12})
	n.Uplinks[0].Addr = netip.Addr{} // uplink1 has no address yet
	_, err := Compile(n)
	if err == nil || !strings.Contains(err.Error(), "sliver s1 leases 1:20000 on uplink 1, which the node does not have (it has uplinks 0 (uplink0))") {
		t.Fatalf("err %v", err)
	}
}

func TestCompileRefusesWhatTheControllerNeverWrites(t *testing.T) {
	links := map[string]int{"s0-s1": 11, "s0-s2": 12, "s2-s1": 13}
	cases := []struct {
		name    string
		slivers []intent.LocalSliver
		want    string
	}{
		{"lease on an uplink the node lacks", []intent.LocalSliver{local("s1", 1, "2:10000-10099")},
			"sliver s1 leases 2:10000-10099 on uplink 2, which the node does not have (it has uplinks 0 (uplink0), 1 (uplink1))"},
		{"shared slot", []intent.LocalSliver{local("s1", 1, "10000"), local("s2", 1, "10001")}, "slivers s1 and s2 share slot 1"},
		{"slot 0", []intent.LocalSliver{local("s1", 0, "10000")}, "slot 0: want 1..16384"},
		{"slot too high", []intent.LocalSliver{local("s1", limits.MaxSlivers+1, "10000")}, "slot 16385"},
		{"name twice", []intent.LocalSliver{local("s1", 1, "10000"), local("s1", 2, "10001")}, "sliver s1 listed twice"},
		{"bad name", []intent.LocalSliver{local("S1", 1, "10000")}, `sliver name "S1"`},
		{"overlap", []intent.LocalSliver{local("s1", 1, "10000-10099"), local("s2", 2, "10099")}, "sliver s2: ports 10099 on uplink 0 overlap h1/s1's lease 10000-10099"},
		{"no leases", []intent.LocalSliver{{Name: "s1", Slot: 1}}, "sliver s1: no leases"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Compile(node(c.slivers, links))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want %q", err, c.want)
			}
		})
	}
}

func TestAnyOverlapFindsEveryPortSharedOnOneUplink(t *testing.T) {
	l := func(up int, lo, hi uint16) intent.Lease { return intent.Lease{Uplink: up, Lo: lo, Hi: hi} }
	sl := func(ls ...intent.Lease) intent.LocalSliver { return intent.LocalSliver{Leases: ls} }
	cases := []struct {
		name    string
		slivers []intent.LocalSliver
		want    bool
	}{
		{"none", nil, false},
		{"adjacent", []intent.LocalSliver{sl(l(0, 10, 19)), sl(l(0, 20, 29))}, false},
		{"one port shared", []intent.LocalSliver{sl(l(0, 10, 20)), sl(l(0, 20, 29))}, true},
		{"same ports, other uplinks", []intent.LocalSliver{sl(l(0, 10, 20)), sl(l(1, 10, 20))}, false},
		{"inside a long one, after a short one", []intent.LocalSliver{sl(l(0, 10, 100)), sl(l(0, 20, 30)), sl(l(0, 50, 60))}, true},
		{"one sliver's own", []intent.LocalSliver{sl(l(0, 10, 20), l(0, 15, 25))}, true},
		{"no range", []intent.LocalSliver{sl(l(0, 10, 20)), sl(l(0, 30, 15))}, false},
	}
	for _, c := range cases {
		if got := anyOverlap(c.slivers); got != c.want {
			t.Errorf("%s: anyOverlap = %v, want %v", c.name, got, c.want)
		}
	}
	// And on random slivers, as a pairwise comparison finds.
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 2000; round++ {
		var slivers []intent.LocalSliver
		var all []intent.Lease
		for i := 0; i < 1+rng.IntN(6); i++ {
			var s intent.LocalSliver
			for j := 0; j < 1+rng.IntN(3); j++ {
				lo := uint16(rng.IntN(200))
				le := l(rng.IntN(2), lo, lo+uint16(rng.IntN(30)))
				s.Leases = append(s.Leases, le)
				all = append(all, le)
			}
			slivers = append(slivers, s)
		}
		want := false
		for i := range all {
			for j := i + 1; j < len(all); j++ {
				a, b := all[i], all[j]
				if a.Uplink == b.Uplink && max(a.Lo, b.Lo) <= min(a.Hi, b.Hi) {
					want = true
				}
			}
		}
		if got := anyOverlap(slivers); got != want {
			t.Fatalf("round %d: anyOverlap(%v) = %v, a pairwise comparison says %v", round, slivers, got, want)
		}
	}
}

func TestLinkMACsAreTheHostsLinksAsReadOneByOne(t *testing.T) {
	macOf, err := linkMACs()
	if err != nil {
		t.Fatal(err)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, ifc := range ifs {
		one, err := net.InterfaceByIndex(ifc.Index)
		if err != nil {
			t.Fatal(err)
		}
		mac, err := macOf(ifc.Index)
		if err != nil || mac.String() != one.HardwareAddr.String() {
			t.Errorf("link %s (%d): MAC %v, %v; read alone: %v", ifc.Name, ifc.Index, mac, err, one.HardwareAddr)
		}
	}
	if _, err := macOf(1 << 30); err == nil || !strings.Contains(err.Error(), "sliver link 1073741824") {
		t.Errorf("a link that is not there: %v, want an error naming it", err)
	}
}
