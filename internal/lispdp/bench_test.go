package lispdp

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"
)

// BenchmarkPrivilegedProgRun is the per-packet cost in the kernel of
// encapsulation and decapsulation, beside the same program on a packet it
// leaves alone (the baseline every other packet on the interface pays).
//
// BPF_PROG_RUN repeats reuse one skb, which the first run rewrites (an
// encapsulated packet is no longer an EID's, a decapsulated one no longer
// LISP): so each packet is its own BPF_PROG_RUN with repeat 1, and the
// figure is the kernel's own timing of that one run (ns/pkt), which leaves
// the syscall out but keeps the kernel's clock reads around the run, the
// same in every row.
func BenchmarkPrivilegedProgRun(b *testing.B) {
	d := gateway(b)
	progs := d.Programs()
	tcp := layers.IPProtocolTCP
	for _, bc := range []struct {
		name  string
		prog  *ebpf.Program
		frame []byte
	}{
		{"encap/baseline-not-an-EID", progs.Encap, frame(macRtr, macGW, inner{proto: tcp, src: "10.1.0.50", dst: "203.0.113.9", sport: 40000, dport: 80, payload: 64}.ip(b))},
		{"encap/negative-mapping", progs.Encap, frame(macRtr, macGW, inner{proto: tcp, src: "10.1.0.50", dst: "10.2.9.9", sport: 40000, dport: 80, payload: 64}.ip(b))},
		{"encap/hashed", progs.Encap, frame(macRtr, macGW, inner{proto: tcp, src: "10.1.0.50", dst: "10.2.0.2", sport: 40000, dport: 80, payload: 64}.ip(b))},
		{"encap/pinned", progs.Encap, frame(macRtr, macGW, inner{proto: tcp, src: "10.1.0.11", dst: "10.2.0.2", sport: 40000, dport: 80, payload: 64}.ip(b))},
		{"encap/pinned-1400B", progs.Encap, frame(macRtr, macGW, inner{proto: tcp, src: "10.1.0.11", dst: "10.2.0.2", sport: 40000, dport: 80, payload: 1400}.ip(b))},
		{"decap/baseline-not-LISP", progs.Decap, frame(macGW, macP1nh, inner{proto: tcp, src: "198.51.100.1", dst: "192.0.2.1", sport: 80, dport: 40000, payload: 64}.ip(b))},
		{"decap/lisp", progs.Decap, frame(macGW, macP1nh, outer{src: "198.51.100.1", dst: "192.0.2.1", sport: 50000, ttl: 64, flags: 0x80}.encap(
			inner{proto: tcp, src: "10.2.0.2", dst: "10.1.0.11", sport: 80, dport: 40000, payload: 64}.ip(b)))},
		{"decap/lisp-iid", progs.Decap, frame(macGW, macP2nh, outer{src: "198.51.100.5", dst: "192.0.2.5", sport: 50000, ttl: 64, flags: 0x88, iidLSB: 7 << 8}.encap(
			inner{proto: tcp, src: "10.2.0.2", dst: "10.1.0.12", sport: 80, dport: 40000, payload: 64}.ip(b)))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var total time.Duration
			for b.Loop() {
				_, per, err := bc.prog.Benchmark(bc.frame, 1, nil)
				if err != nil {
					b.Fatal(err)
				}
				total += per
			}
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/pkt")
		})
		if bc.name == "encap/baseline-not-an-EID" || bc.name == "decap/baseline-not-LISP" {
			// The baselines leave the packet as it was, so they can also
			// be timed the usual way (one BPF_PROG_RUN, b.N repeats): the
			// difference to the row above is what a single run's timing
			// itself adds to every row.
			b.Run(bc.name+"-repeated", func(b *testing.B) {
				_, per, err := bc.prog.Benchmark(bc.frame, b.N, b.ResetTimer)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(per.Nanoseconds()), "ns/pkt")
			})
		}
	}
}
