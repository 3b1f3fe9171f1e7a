package datapath

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"
)

// The datapath's own per-packet cost, without the kernel around it: each
// program run on one frame with BPF_PROG_RUN, many times. Intra-subnet
// and routed frames side by side show what crossing the virtual gateway
// adds (the TTL hop, and the conntrack lookup of a flow admitted earlier).
//
//	go test -run '^$' -bench PacketCost ./internal/datapath/
func BenchmarkPrivilegedPacketCost(b *testing.B) {
	// The production objects: the test hooks must cost them nothing.
	k := loadKernel(b, Options{}, testDesired(), testIfindex)
	udp, tcp := layers.IPProtocolUDP, layers.IPProtocolTCP
	cases := []struct {
		name string
		prog *ebpf.Program
		in   frame
	}{
		{"vif/intra-subnet", k.VifProgram(), frame{src: vmac(web1), dst: vmac(web2), saddr: web1, daddr: web2, proto: udp}},
		// web may reach db on tcp/5432 only (testDesired's rules).
		{"vif/routed", k.VifProgram(), frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db1, proto: tcp, dport: 5432}},
		{"uplink/intra-subnet", k.UplinkProgram(), frame{src: h2MAC, dst: h1MAC, saddr: web2, daddr: web1, proto: udp}},
		{"uplink/routed-reply", k.UplinkProgram(), frame{src: h2MAC, dst: h1MAC, saddr: db1, daddr: web1, proto: tcp, sport: 5432, dport: 40000, ttl: 63}},
	}
	// The routed flow is admitted once, as its first packet would be.
	if _, err := k.VifProgram().Run(&ebpf.RunOptions{Data: cases[1].in.bytes(b)}); err != nil {
		b.Fatal(err)
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			in := c.in.bytes(b)
			// One run per call, each on a fresh copy of the frame: a
			// repeated run would see the frame its last run rewrote (and
			// time a drop). The kernel times each run on its own, so the
			// syscall around it is not counted.
			var total time.Duration
			for i := 0; i < b.N; i++ {
				ret, d, err := c.prog.Benchmark(in, 1, nil)
				if err != nil {
					b.Fatal(err)
				}
				if ret != actRedirect {
					b.Fatalf("verdict %d: the frame is not forwarded, so this would time a drop", ret)
				}
				total += d
			}
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/packet")
		})
	}
}
