package portspace

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/limits"
)

// fullNode is a host with four uplinks whose every port (1..65535) is
// leased: 64 slivers of 4096 ports each (port 0 left out), 16 per uplink,
// each with its one link, so portspace_ports holds 262,140 entries of its
// 262,144. shrink takes one port off the first sliver's lease (a lease
// change); dropLast leaves the last sliver (4096 ports) out.
func fullNode(shrink, dropLast bool) feature.Node {
	n := feature.Node{Name: "h1", Desired: intent.Desired{Node: "h1"}}
	links := map[string]int{}
	for u := 0; u < limits.MaxUplinks; u++ {
		n.Uplinks = append(n.Uplinks, feature.Uplink{Index: u, Name: fmt.Sprintf("uplink%d", u), Ifindex: 2 + u,
			MAC: upMAC, Addr: netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + u)}), Bits: 24})
	}
	for i := 0; i < 64; i++ {
		if dropLast && i == 63 {
			break
		}
		u := i % limits.MaxUplinks
		lo, hi := uint16(i/limits.MaxUplinks*4096), uint16(i/limits.MaxUplinks*4096+4095)
		if lo == 0 {
			lo = 1
		}
		if shrink && i == 0 {
			hi--
		}
		name := fmt.Sprintf("s%d", i+1)
		n.Desired.Slivers = append(n.Desired.Slivers, intent.LocalSliver{Name: name, Slot: uint32(i + 1),
			Leases: []intent.Lease{{Uplink: u, Lo: lo, Hi: hi}}})
		links[intent.SliverIfname(name, u)] = 100 + i
	}
	n.Ifindex = func(name string) (int, error) {
		if i, ok := links[name]; ok {
			return i, nil
		}
		return 0, fmt.Errorf("link %s not found", name)
	}
	return n
}

// pass is what one agent pass does for the feature: compile, then sync.
func pass(tb testing.TB, f *Feature, n feature.Node) {
	p, err := f.Compile(n)
	if err != nil {
		tb.Fatalf("compile: %v", err)
	}
	if err := f.Sync(p); err != nil {
		tb.Fatalf("sync: %v", err)
	}
}

// The feature's share of an agent pass when every port of four uplinks is
// leased (262,140 entries in portspace_ports): a pass that changes nothing (every
// resync, every change elsewhere), the first pass of a restarted agent,
// and a pass in which one lease lost (or got back) a port.
// The real maps, written as root.
//
//	go test -run '^$' -bench PortspacePass -benchtime 20x ./internal/portspace/
func BenchmarkPrivilegedPortspacePass(b *testing.B) {
	k, f, _ := loadFeature(b)
	full, shrunk := fullNode(false, false), fullNode(true, false)
	pass(b, f, full)
	b.Run("unchanged", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			pass(b, f, full)
		}
	})
	b.Run("first-after-restart", func(b *testing.B) {
		// A new agent on the maps its predecessor wrote: it reads them
		// and writes what differs (nothing here).
		for i := 0; i < b.N; i++ {
			fresh := New(k.Kernel)
			fresh.links, fresh.vifMAC = f.links, f.vifMAC
			pass(b, fresh, full)
		}
	})
	b.Run("one-lease-changed", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if i%2 == 0 {
				pass(b, f, shrunk)
			} else {
				pass(b, f, full)
			}
		}
	})
}

// manySlivers is h1 with n slivers of ten ports each on uplink 0.
func manySlivers(n int) feature.Node {
	var sl []intent.LocalSliver
	links := map[string]int{}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("s%d", i+1)
		sl = append(sl, intent.LocalSliver{Name: name, Slot: uint32(i + 1),
			Leases: []intent.Lease{{Uplink: 0, Lo: uint16(1024 + i*10), Hi: uint16(1024 + i*10 + 9)}}})
		links[intent.SliverIfname(name, 0)] = 100 + i
	}
	return node(sl, links)
}

// Compile's share of a pass with many slivers on the host: each pass
// compiles them all again, so it must not compare every sliver's leases
// with every other's.
//
//	go test -run '^$' -bench PortspaceCompile -benchtime 5x ./internal/portspace/
func BenchmarkPortspaceCompile(b *testing.B) {
	for _, n := range []int{64, 1000, 4000} {
		nd := manySlivers(n)
		b.Run(fmt.Sprintf("slivers=%d", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := Compile(nd); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
