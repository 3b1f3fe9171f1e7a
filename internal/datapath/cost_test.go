package datapath

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
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
		{"vif/intra-subnet", k.VifProgram(), frame{Src: vmac(web1), Dst: vmac(web2), Saddr: web1, Daddr: web2, Proto: udp}},
		// web may reach db on tcp/5432 only (testDesired's rules).
		{"vif/routed", k.VifProgram(), frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: tcp, Dport: 5432}},
		{"uplink/intra-subnet", k.UplinkProgram(), frame{Src: h2MAC, Dst: h1MAC, Saddr: web2, Daddr: web1, Proto: udp}},
		{"uplink/routed-reply", k.UplinkProgram(), frame{Src: h2MAC, Dst: h1MAC, Saddr: db1, Daddr: web1, Proto: tcp, Sport: 5432, Dport: 40000, TTL: 63}},
	}
	// The routed flow is admitted once, as its first packet would be.
	if _, err := k.VifProgram().Run(&ebpf.RunOptions{Data: cases[1].in.bytes(b)}); err != nil {
		b.Fatal(err)
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportMetric(bpftest.PacketCost(b, c.prog, c.in.bytes(b), b.N, bpftest.ActRedirect, nil), "ns/packet")
		})
	}
}
