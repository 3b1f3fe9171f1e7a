package portspace

import (
	"fmt"
	"net"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/testenv"
)

// Steering cost per packet with 1, 100 and 10,000 leases on the host: one
// array lookup whatever their number, so flat. The production objects.
//
//	go test -run '^$' -bench PortspaceCost ./internal/portspace/
func BenchmarkPrivilegedPortspaceCost(b *testing.B) {
	testenv.RequireRoot(b, "BPF_PROG_RUN")
	for _, leases := range []int{1, 100, 10000} {
		r, err := datapath.Open("", datapath.Options{})
		if err != nil {
			b.Fatal(err)
		}
		ps, err := Open(r)
		if err != nil {
			b.Fatal(err)
		}
		k := testKernel{r, ps}
		f := New(r)
		f.links = &fakeLinks{slivers: map[string]int{}}
		f.vifMAC = func(int) (net.HardwareAddr, error) { return vifMAC, nil }
		cfg, _ := k.Map("config")
		var nc datapath.NodeConfig
		nc.Features = datapath.FeaturePortspace
		nc.VmNet = 10    // 10.0.0.0/8 in network order
		nc.VmMask = 0xff // /8
		if err := cfg.Put(uint32(0), nc); err != nil {
			b.Fatal(err)
		}
		// leases slivers of one port each from 10000 up; slot 1's link is
		// ifindex 1 so its frames can be sent.
		p := Plan{Uplinks: testPlan(0).Uplinks}
		for i := 0; i < leases; i++ {
			ifindex := 100 + i
			if i == 0 {
				ifindex = 1
			}
			p.Slivers = append(p.Slivers, Sliver{Name: fmt.Sprintf("s%d", i+1), Slot: uint32(i + 1),
				Vifs:   []Vif{{Uplink: 0, Name: fmt.Sprintf("v%d", i+1), Ifindex: ifindex}},
				Leases: []Lease{{Uplink: 0, Lo: uint16(10000 + i), Hi: uint16(10000 + i)}}})
		}
		if err := f.Sync(p); err != nil {
			b.Fatal(err)
		}
		last := uint16(10000 + leases - 1)
		for _, c := range []struct {
			name string
			prog *ebpf.Program
			in   bpftest.Frame
		}{
			{"uplink/to-sliver", k.UplinkProgram(), fromInet(udp, last)},
			{"sliver/to-fabric", k.SliverProgram(), fromS1(udp, 10000)},
			{"loopback/to-sliver", k.SliverProgram(), bpftest.Frame{Src: upMAC, Dst: upMAC, Saddr: public, Daddr: public, Proto: udp, Sport: 10000, Dport: last}},
		} {
			if c.name == "loopback/to-sliver" {
				c.prog = k.LoopbackProgram()
				c.in = bpftest.Frame{Saddr: public, Daddr: public, Proto: udp, Sport: 40000, Dport: last}
			}
			b.Run(fmt.Sprintf("%s/leases=%d", c.name, leases), func(b *testing.B) {
				b.ReportMetric(bpftest.PacketCost(b, c.prog, c.in.Bytes(b), b.N, bpftest.ActRedirect, nil), "ns/packet")
			})
		}
		r.Close() // port space's with it
	}
}
