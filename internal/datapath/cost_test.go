package datapath

import (
	"testing"
	"time"

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

// What publishing events for onehop observe costs per packet, with no one
// observing and with a stream running: a packet of a flow admitted before
// (the common case: no event either way), and a packet that opens a new
// flow each time (the one that publishes an event while observed), in the
// same run, as on/off ratios.
//
//	go test -run '^$' -bench ObserveCost ./internal/datapath/
func BenchmarkPrivilegedObserveCost(b *testing.B) {
	k := loadKernel(b, Options{}, testDesired(), testIfindex)
	r, err := k.DropEvents()
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	// Someone reads the ring, as the agent does: the ring never fills.
	go func() {
		for {
			if _, err := r.Read(); err != nil {
				return
			}
		}
	}()
	// No share to run out of: the run opens flows far faster than a VM
	// may (interval 0: unlimited).
	if err := k.vif.ShareConfig.Put(uint32(0), ShareLimits{}); err != nil {
		b.Fatal(err)
	}
	// A budget no run reaches: every new flow publishes while observed.
	unbounded := ObserveLimits{NsPerEvent: 1, Burst: 1 << 30}
	tcp := layers.IPProtocolTCP
	routed := frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: tcp, Dport: 5432}.bytes(b)
	// One frame per source port: each opens its own flow once conntrack
	// is emptied.
	const flows = 4096
	fresh := make([][]byte, flows)
	for i := range fresh {
		fresh[i] = frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: tcp, Sport: uint16(10000 + i), Dport: 5432}.bytes(b)
	}
	emptyConntrack := func() {
		var key CtKey
		var keys []CtKey
		var e CtEntry
		it := k.vif.Conntrack.Iterate()
		for it.Next(&key, &e) {
			keys = append(keys, key)
		}
		for _, key := range keys {
			k.vif.Conntrack.Delete(key) //nolint:errcheck // gone already is fine
		}
	}
	newFlows := func(b *testing.B) float64 {
		var total time.Duration
		n := 0
		for n < b.N {
			emptyConntrack()
			for _, in := range fresh {
				if n == b.N {
					break
				}
				ret, d, err := k.VifProgram().Benchmark(in, 1, nil)
				if err != nil || ret != bpftest.ActRedirect {
					b.Fatalf("BPF_PROG_RUN: verdict %d, %v", ret, err)
				}
				total += d
				n++
			}
		}
		return float64(total.Nanoseconds()) / float64(n)
	}
	established := func(b *testing.B) float64 {
		return bpftest.PacketCost(b, k.VifProgram(), routed, b.N, bpftest.ActRedirect, nil)
	}
	for _, c := range []struct {
		name string
		cost func(*testing.B) float64
	}{{"established-flow", established}, {"new-flow", newFlows}} {
		b.Run(c.name, func(b *testing.B) {
			if err := k.SetObserve(ObserveLimits{}); err != nil {
				b.Fatal(err)
			}
			off := c.cost(b)
			on := unbounded
			on.Flows = 1
			if err := k.SetObserve(on); err != nil {
				b.Fatal(err)
			}
			onCost := c.cost(b)
			b.ReportMetric(off, "ns/packet-off")
			b.ReportMetric(onCost, "ns/packet-on")
			b.ReportMetric(onCost/off, "on/off")
		})
	}
}
