package vnat

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// migrations makes n connections of A's, each with the local end moved
// (no route needed), none of them the benchmark's frame.
func migrations(n int) []Migration {
	out := make([]Migration, 0, n)
	for i := range n {
		remote := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 20, byte(i >> 8), byte(i)}), 80)
		out = append(out, Migration{
			Virtual:  Virtual{TCP, netip.AddrPortFrom(netip.MustParseAddr("10.9.1.2"), uint16(1024+i%60000)), remote},
			Physical: Physical{TCP, netip.AddrPortFrom(netip.MustParseAddr("10.9.3.2"), uint16(1024+i%60000)), remote},
		})
	}
	return out
}

// BenchmarkPrivilegedProgRun is the per-packet cost in the kernel
// (BPF_PROG_RUN, ns per run) with 0, 1 and 10,000 connections migrated
// (with 1, "translated" translates on the first run only: see below),
// for a packet of a connection that is not migrated (what every
// connection pays) and one that is (egress, both ends moved).
func BenchmarkPrivilegedProgRun(b *testing.B) {
	n := newTestNS(b)
	d := openIn(b, n, Options{})
	egress, _, _ := d.Programs()
	untranslated := pkt{proto: TCP, src: otherApp, dst: vB, payload: "0123456789"}.build(b)
	translated := pkt{proto: TCP, src: vA, dst: vB, payload: "0123456789"}.build(b)
	for _, size := range []int{0, 1, 10000} {
		ms := migrations(size)
		if size > 0 {
			ms[0] = Migration{Virtual{TCP, vA, vB}, Physical{TCP, pA, pB}}
		}
		if size > 1 {
			// BPF_PROG_RUN's repeats reuse one skb, which the first run
			// rewrites: the reverse migration turns it back on the next
			// run, so every run translates.
			ms[1] = Migration{Virtual{TCP, pA, pB}, Physical{TCP, vA, vB}}
		}
		if err := d.TranslateBatch(ms); err != nil {
			b.Fatal(err)
		}
		for _, f := range []struct {
			name  string
			frame []byte
		}{{"untranslated", untranslated}, {"translated", translated}} {
			if size == 0 && f.name == "translated" {
				continue
			}
			b.Run(fmt.Sprintf("migrated=%d/%s", size, f.name), func(b *testing.B) {
				benchProg(b, egress, f.frame)
			})
		}
		for _, m := range ms {
			if err := d.Forget(m.Virtual); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func benchProg(b *testing.B, prog *ebpf.Program, frame []byte) {
	_, per, err := prog.Benchmark(frame, b.N, b.ResetTimer)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(per.Nanoseconds()), "ns/pkt")
}

// BenchmarkPrivilegedTranslateBatch is the time to install N migrated
// connections with one batched map update, per connection.
func BenchmarkPrivilegedTranslateBatch(b *testing.B) {
	n := newTestNS(b)
	for _, size := range []int{10, 100, 1000, 10000} {
		ms := migrations(size)
		b.Run(fmt.Sprintf("n=%d", size), func(b *testing.B) {
			d := openIn(b, n, Options{})
			for b.Loop() {
				if err := d.TranslateBatch(ms); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/conn")
		})
	}
}

// BenchmarkPrivilegedTranslate is Translate one connection at a time.
func BenchmarkPrivilegedTranslate(b *testing.B) {
	n := newTestNS(b)
	d := openIn(b, n, Options{})
	ms := migrations(10000)
	i := 0
	for b.Loop() {
		m := ms[i%len(ms)]
		if err := d.Translate(m.Virtual, m.Physical); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkPrivilegedProgRunWithPeersAway is the egress cost while
// connections are marked "peer away" (the keepalive helper looks every
// TCP segment up in vnat_away): 1 and 10,000 marked, nothing migrated,
// for a segment of a connection that is not marked, and for a data
// segment of one that is (looked up, its snd_nxt noted, left to go).
func BenchmarkPrivilegedProgRunWithPeersAway(b *testing.B) {
	n := newTestNS(b)
	d := openIn(b, n, Options{})
	egress, _, _ := d.Programs()
	other := pkt{proto: TCP, src: otherApp, dst: vB, payload: "0123456789"}.build(b)
	marked := pkt{proto: TCP, src: vA, dst: vB, payload: "0123456789"}.build(b)
	for _, size := range []int{1, 10000} {
		ms := migrations(size)
		ms[0].Virtual = Virtual{Proto: TCP, Local: vA, Remote: vB}
		for _, m := range ms {
			if err := d.StartKeepalive(m.Virtual); err != nil {
				b.Fatal(err)
			}
		}
		for _, f := range []struct {
			name  string
			frame []byte
		}{{"other connection", other}, {"marked connection", marked}} {
			b.Run(fmt.Sprintf("away=%d/%s", size, f.name), func(b *testing.B) {
				benchProg(b, egress, f.frame)
			})
		}
		for _, m := range ms {
			if _, err := d.StopKeepalive(m.Virtual); err != nil {
				b.Fatal(err)
			}
		}
	}
}
