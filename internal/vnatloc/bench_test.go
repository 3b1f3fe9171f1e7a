package vnatloc

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/vcmp"
)

// BenchmarkHeld10000Records compares Held (list and decode every record)
// with HeldIndex.HeldAt over an in-memory store of 10,000 live records of
// moved ends, in the two shapes that bound it: 100 VMs × 100 connections
// (200 held addresses) and 10,000 ends each with its own two addresses
// (20,000 held addresses: HeldAt's cost is the held set's size).
//
//	go test -run '^$' -bench Held10000 ./internal/vnatloc/
func BenchmarkHeld10000Records(b *testing.B) {
	now := time.Unix(1_000_000, 0)
	for _, shape := range []struct {
		name  string
		addrs int
		rec   func(i int) (vcmp.Tuple, netip.AddrPort)
	}{
		{"vms=100xconns=100", 200, func(i int) (vcmp.Tuple, netip.AddrPort) {
			v, c := i/100, i%100
			return vcmp.Tuple{Proto: vcmp.TCP, Local: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, 1, byte(2 + v)}), uint16(30000+c)),
					Remote: netip.MustParseAddrPort("10.1.3.2:7100")},
				netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, 2, byte(2 + v)}), uint16(30000+c))
		}},
		{"distinct=10000", 20000, func(i int) (vcmp.Tuple, netip.AddrPort) {
			return vcmp.Tuple{Proto: vcmp.TCP, Local: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i / 250), byte(2 + i%250)}), 30000),
					Remote: netip.MustParseAddrPort("10.1.250.2:7100")},
				netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, byte(i / 250), byte(2 + i%250)}), 30000)
		}},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		st := store.NewMemory()
		for i := range 10000 {
			t, phys := shape.rec(i)
			v, err := json.Marshal(Stored{Proto: "tcp", Local: t.Local.String(), Remote: t.Remote.String(), Phys: phys.String(),
				Owner: "addr:" + phys.Addr().String(), Expires: now.Add(time.Minute).UTC()})
			if err != nil {
				b.Fatal(err)
			}
			if err := st.Put(ctx, Key(t), v); err != nil {
				b.Fatal(err)
			}
		}
		x := startIndex(b, ctx, st)
		for _, mode := range []string{"Held", "HeldAt"} {
			b.Run(fmt.Sprintf("%s/%s", shape.name, mode), func(b *testing.B) {
				for b.Loop() {
					var h map[netip.Addr]bool
					var err error
					if mode == "Held" {
						h, err = Held(ctx, st, now)
					} else {
						h, err = x.HeldAt(ctx, now)
					}
					if err != nil || len(h) != shape.addrs {
						b.Fatalf("%d held (%v), want %d", len(h), err, shape.addrs)
					}
				}
			})
		}
		cancel()
	}
}
