package tap

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/netns"
)

func openProduction() (*datapath.Kernel, error) { return datapath.Open("", datapath.Options{}) }

// costRun times prog on in, n runs of one packet each, in the lab's
// namespace where the copies' devices are: ns per packet.
func costRun(tb testing.TB, l *lab, prog *ebpf.Program, in []byte, n int, want uint32) float64 {
	tb.Helper()
	return bpftest.PacketCost(tb, prog, in, n, want, func(run func() error) error { return netns.Do(l.ns, run) })
}

// The sender's edge per packet, with 0, 1 and 100 rules on the host: the
// production objects, web1's UDP packet to web2 (on h2).
//
//	go test -run '^$' -bench TapCost -benchtime 100000x ./internal/tap/
func BenchmarkPrivilegedTapCost(b *testing.B) {
	const udp = 17
	in := frame{Src: vmac(web1), Dst: vmac(web2), Saddr: web1, Daddr: web2, Proto: layers.IPProtocolUDP, Sport: 40000, Dport: 100}
	none := [2]uint16{}
	port := func(p uint16) [2]uint16 { return [2]uint16{p, p} }
	// A copied packet bound for the uplink is sent first and its copies
	// after, so the program consumes it (stolen) rather than redirecting it.
	cases := []struct {
		name string
		taps []intent.TapRule
		want uint32
	}{
		{"rules=0", nil, bpftest.ActRedirect},
		{"rules=1/other-receiver", []intent.TapRule{rule(1, vm(web1), vm(db1), mon1, "h1")}, bpftest.ActRedirect},
		{"rules=1/copied-local", []intent.TapRule{rule(1, vm(web1), vm(web2), mon1, "h1")}, bpftest.ActStolen},
		{"rules=1/copied-remote", []intent.TapRule{rule(1, vm(web1), vm(web2), mon2, "h2")}, bpftest.ActStolen},
	}
	// 100 rules of one sender, to 100 receivers: the index leaves one.
	var byReceiver, byPort []intent.TapRule
	for i := 0; i < 100; i++ {
		r := netip.AddrFrom4([4]byte{10, 1, 1, byte(100 + i)})
		if i == 0 {
			r = web2
		}
		byReceiver = append(byReceiver, rule(uint32(i+1), vm(web1), vm(r), mon1, "h1"))
		// any to any, told apart by port only: all 100 are checked.
		byPort = append(byPort, withFilter(rule(uint32(i+1), anyEnd, anyEnd, mon1, "h1"), udp, none, port(uint16(i+1))))
	}
	cases = append(cases, struct {
		name string
		taps []intent.TapRule
		want uint32
	}{"rules=100/one-receiver-matches", byReceiver, bpftest.ActStolen}, struct {
		name string
		taps []intent.TapRule
		want uint32
	}{"rules=100/all-candidates-one-port-matches", byPort, bpftest.ActStolen})
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			l := newLab(b, "up0", "vif-web3", "vif-mon1", "vif-mon4")
			h := loadHost(b, l, "h1", h1MAC, h1Desired(c.taps), map[netip.Addr]net.HardwareAddr{web2: h2MAC, db1: h2MAC}, openProduction)
			b.ReportMetric(costRun(b, l, h.k.VifProgram(), in.bytes(b), b.N, c.want), "ns/packet")
		})
	}
}

// Today's paths with the TAP off, against main's build in the same
// process: each round times both builds' programs on the same frame, the
// old ones loaded from their .o with every map shared by name with the
// new ones (so both see one state, written by the new agent code).
//
//	git show main:internal/datapath/vif_bpfel.o > /tmp/base/vif_bpfel.o
//	git show main:internal/datapath/uplink_bpfel.o > /tmp/base/uplink_bpfel.o
//	ONEHOP_BASELINE_DIR=/tmp/base go test -run '^$' -bench PacketCostBeside -benchtime 1x ./internal/tap/
func BenchmarkPrivilegedPacketCostBesideBaseline(b *testing.B) {
	dir := os.Getenv("ONEHOP_BASELINE_DIR")
	l := newLab(b, "up0", "vif-web3", "vif-mon1", "vif-mon4")
	h := loadHost(b, l, "h1", h1MAC, h1Desired(nil), map[netip.Addr]net.HardwareAddr{web2: h2MAC, db1: h2MAC}, openProduction)
	tcp, udp := layers.IPProtocolTCP, layers.IPProtocolUDP
	paths := []struct {
		name   string
		uplink bool
		in     frame
	}{
		{"vif/intra-subnet", false, frame{Src: vmac(web1), Dst: vmac(web2), Saddr: web1, Daddr: web2, Proto: udp, Sport: 40000, Dport: 5201}},
		{"vif/routed", false, frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: tcp, Sport: 40000, Dport: 5432}},
		{"uplink/intra-subnet", true, frame{Src: h2MAC, Dst: h1MAC, Saddr: web2, Daddr: web1, Proto: udp, Sport: 40000, Dport: 5201}},
		{"uplink/routed-reply", true, frame{Src: h2MAC, Dst: h1MAC, Saddr: db1, Daddr: web1, Proto: tcp, Sport: 5432, Dport: 40000, TTL: 63}},
	}
	// The routed flow is admitted once, as its first packet would be.
	costRun(b, l, h.k.VifProgram(), paths[1].in.bytes(b), 1, bpftest.ActRedirect)
	progs := map[string][2]*ebpf.Program{"new": {h.k.VifProgram(), h.k.UplinkProgram()}}
	if dir == "" {
		b.Log("ONEHOP_BASELINE_DIR unset: the new build alone")
	} else {
		var old [2]*ebpf.Program
		for i, f := range []struct{ obj, prog string }{{"vif_bpfel.o", "vif_ingress"}, {"uplink_bpfel.o", "uplink_ingress"}} {
			spec, err := ebpf.LoadCollectionSpec(filepath.Join(dir, f.obj))
			if err != nil {
				b.Fatal(err)
			}
			opts := ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{}}
			for name, ms := range spec.Maps {
				if ms.Pinning == ebpf.PinNone {
					continue
				}
				ms.Pinning = ebpf.PinNone
				m, err := h.k.Map(name)
				if err != nil {
					b.Fatalf("baseline map %s: %v", name, err)
				}
				if m.MaxEntries() != ms.MaxEntries || m.ValueSize() != ms.ValueSize {
					continue // the counters, sized by enums that grew: its own
				}
				opts.MapReplacements[name] = m
			}
			coll, err := ebpf.NewCollectionWithOptions(spec, opts)
			if err != nil {
				b.Fatalf("load baseline %s: %v", f.obj, err)
			}
			b.Cleanup(coll.Close)
			old[i] = coll.Programs[f.prog]
		}
		progs["main"] = old
	}
	const rounds, n = 7, 50000
	results := map[string][]float64{}
	diffs := map[string][]float64{}
	for r := 0; r < rounds; r++ {
		for _, p := range paths {
			in := p.in.bytes(b)
			i := 0
			if p.uplink {
				i = 1
			}
			got := map[string]float64{}
			order := []string{"new", "main"}
			if r%2 == 1 {
				order = []string{"main", "new"}
			}
			for _, build := range order {
				pr, ok := progs[build]
				if !ok {
					continue
				}
				got[build] = costRun(b, l, pr[i], in, n, bpftest.ActRedirect)
				results[p.name+" "+build] = append(results[p.name+" "+build], got[build])
			}
			if _, ok := got["main"]; ok {
				diffs[p.name] = append(diffs[p.name], got["new"]-got["main"])
			}
		}
	}
	median := func(v []float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	for _, p := range paths {
		line := fmt.Sprintf("%-20s new %6.1f ns", p.name, median(results[p.name+" new"]))
		if d, ok := diffs[p.name]; ok {
			line += fmt.Sprintf("  main %6.1f ns  paired difference (median of %d) %+5.1f ns", median(results[p.name+" main"]), rounds, median(d))
		}
		b.Log(line)
	}
}
