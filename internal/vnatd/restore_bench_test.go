package vnatd

import (
	"fmt"
	"testing"
)

// BenchmarkRestore is the engine's part of restoring N connections with one
// peer (fake datapath, in-memory streams): both ends' work, the mover's
// walk and updates and the peer's answers. Its time per connection should
// not grow with N (issue 20 item 7: the peer's conflict check scanned every
// connection for each update, 0.07 s at 1,000 and 32 s at 10,000 on this machine). The
// daemons' figure is bench's vnat-restore.
func BenchmarkRestore(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				nw := newNetwork()
				a := nw.add(b, "a", "10.0.1.1", Config{})
				p := nw.add(b, "b", "10.0.2.2", Config{})
				for i := range n {
					connect(a, p, uint16(20000+i))
				}
				keyAll(b, a, p)
				old, new := nw.move(a, "10.0.3.3")
				b.StartTimer()
				if err := a.e.Restore(b.Context(), old, new); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/conn")
		})
	}
}
