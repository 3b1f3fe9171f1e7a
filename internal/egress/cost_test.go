package egress

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/testenv"
)

// Per-packet cost of a live flow out (VM program) and back (uplink
// program) with 1 and 1,000 egress VMs on the host: a hash lookup by the
// VM's address and 5-tuple out, one array lookup by port back, so flat.
// The production objects.
//
//	go test -run '^$' -bench EgressCost -benchtime 200000x ./internal/egress/
func BenchmarkPrivilegedEgressCost(b *testing.B) {
	testenv.RequireRoot(b, "BPF_PROG_RUN")
	for _, vms := range []int{1, 1000} {
		k, err := datapath.Open("", datapath.Options{})
		if err != nil {
			b.Fatal(err)
		}
		d := intent.Desired{Node: "h1", VMNet: "10.0.0.0/8"}
		ifindex := map[string]int{}
		for i := 0; i < vms; i++ {
			ip := netip.AddrFrom4([4]byte{10, 1, byte(1 + i/250), byte(2 + i%250)})
			name := fmt.Sprintf("v%d", i)
			ifindex["vif-"+name] = 100 + i
			if i == 0 {
				ifindex["vif-"+name] = 1
			}
			lo := uint16(1024 + 32*i)
			d.Local = append(d.Local, intent.LocalEndpoint{Name: "blue/web/" + name, IP: ip.String(), MAC: vmac(ip).String(), Interface: "vif-" + name,
				Egress: &intent.VMEgress{Slice: intent.Lease{Lo: lo, Hi: lo + 31}, To: []string{"0.0.0.0/0"}}})
		}
		e, _, err := datapath.Compile(d, datapath.Uplink{Ifindex: uplinkIfindex, MAC: h1MAC}, func(n string) (int, error) { return ifindex[n], nil })
		if err != nil {
			b.Fatal(err)
		}
		e.Attach = nil
		if err := k.Apply(e, ""); err != nil {
			b.Fatal(err)
		}
		f := New(k)
		p, err := Compile(feature.Node{Name: "h1", Desired: d, Uplinks: []feature.Uplink{{Index: 0, Ifindex: uplinkIfindex, MAC: h1MAC, Addr: hostAddr, Bits: 24}}})
		if err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(p); err != nil {
			b.Fatal(err)
		}
		if err := k.SetFeatures(datapath.FeatureEgress); err != nil {
			b.Fatal(err)
		}
		v0 := netip.MustParseAddr("10.1.1.2")
		out := bpftest.Frame{Src: vmac(v0), Dst: vmac(gw), Saddr: v0, Daddr: inet, Proto: layers.IPProtocolUDP, Sport: 40000, Dport: 5201}
		// One run opens the flow; the port it took is read back from the
		// VM's own slice (1024-1055), where the reply is aimed.
		r, _, err := k.VifProgram().Benchmark(out.Bytes(b), 1, nil)
		if err != nil || r != bpftest.ActRedirect {
			b.Fatalf("opening the flow: verdict %d, %v", r, err)
		}
		port := uint16(0)
		st, _ := k.Map(MapState)
		for q := uint16(1024); q < 1056; q++ {
			var m mapRecord
			if err := st.Lookup(uint32(1*portsPerU)+uint32(q), &m); err == nil && m.ExpiresNs != 0 {
				port = q
			}
		}
		back := bpftest.Frame{Src: inetMAC, Dst: h1MAC, Saddr: inet, Daddr: hostAddr, Proto: layers.IPProtocolUDP, Sport: 5201, Dport: port}
		for _, c := range []struct {
			name string
			run  func(b *testing.B) float64
		}{
			{"out", func(b *testing.B) float64 {
				return bpftest.PacketCost(b, k.VifProgram(), out.Bytes(b), b.N, bpftest.ActRedirect, nil)
			}},
			{"back", func(b *testing.B) float64 {
				return bpftest.PacketCost(b, k.UplinkProgram(), back.Bytes(b), b.N, bpftest.ActRedirect, nil)
			}},
		} {
			b.Run(fmt.Sprintf("%s/vms=%d", c.name, vms), func(b *testing.B) {
				b.ReportMetric(c.run(b), "ns/packet")
			})
		}
		k.Close()
	}
}
