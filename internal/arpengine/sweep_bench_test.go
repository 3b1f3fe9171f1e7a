package arpengine

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"
)

// sliceTable is a large mapping table read as the kernel's is: a fresh
// slice every read.
type sliceTable struct{ entries []Entry }

func (s *sliceTable) Mappings() ([]Entry, error)                  { return append([]Entry(nil), s.entries...), nil }
func (s *sliceTable) Mapping(netip.Addr) (net.HardwareAddr, bool) { return nil, false }
func (s *sliceTable) ForgetMapping(netip.Addr) error              { return nil }
func (s *sliceTable) MappingCapacity() int                        { return len(s.entries) * 5 / 4 }

// BenchmarkSweepOf200000FreshMappings is the engine's second-by-second
// walk of a table of 200,000 entries in use and recently confirmed: the
// steady state of a host that learned that many (issue 12).
func BenchmarkSweepOf200000FreshMappings(b *testing.B) {
	const n = 200_000
	now := time.Hour
	t := &sliceTable{}
	for i := 0; i < n; i++ {
		a := uint32(10<<24|200<<16) + uint32(i)
		t.entries = append(t.entries, Entry{IP: netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}),
			HostMAC: net.HardwareAddr{2, 0, 0, 0, byte(i >> 8), byte(i)}, Confirmed: now, Used: now})
	}
	e, err := New(Config{HostMAC: hostMAC, HostIP: hostIP}, t, func([]byte) error { return nil },
		func() time.Duration { return now }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := e.Sweep(); err != nil {
			b.Fatal(err)
		}
	}
}
