package datapath

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"
)

// The datapath's own per-packet cost, without the kernel around it: each
// program run on one frame, over and over, with BPF_PROG_RUN. Intra-subnet
// and routed frames side by side show what crossing the virtual gateway
// adds (the TTL hop, and the conntrack lookup of a flow admitted earlier).
//
//	go test -run '^$' -bench PacketCost ./internal/datapath/
func BenchmarkPrivilegedPacketCost(b *testing.B) {
	k := loadTestKernel(b)
	udp := layers.IPProtocolUDP
	cases := []struct {
		name string
		prog *ebpf.Program
		in   frame
	}{
		{"vif/intra-subnet", k.VifProgram(), frame{src: vmac(web1), dst: vmac(web2), saddr: web1, daddr: web2, proto: udp}},
		{"vif/routed", k.VifProgram(), frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db1, proto: udp, dport: 5432}},
		{"uplink/intra-subnet", k.UplinkProgram(), frame{src: h2MAC, dst: h1MAC, saddr: web2, daddr: web1, proto: udp}},
		{"uplink/routed-reply", k.UplinkProgram(), frame{src: h2MAC, dst: h1MAC, saddr: db1, daddr: web1, proto: udp, sport: 5432, dport: 40000, ttl: 63}},
	}
	// The routed flow is admitted once, as its first packet would be.
	if _, err := k.VifProgram().Run(&ebpf.RunOptions{Data: cases[1].in.bytes(b)}); err != nil {
		b.Fatal(err)
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			in := c.in.bytes(b)
			_, per, err := c.prog.Benchmark(in, b.N, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(per.Nanoseconds()), "ns/packet")
		})
	}
}
