package controller

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/testenv"
	"github.com/onehop/onehop/internal/vcmp"
	"github.com/onehop/onehop/internal/vnatloc"
)

// movedVMs has vms VMs of farm 1, moved from 10.1.1.x to 10.1.2.x, each
// store conns connections' records at s through a location server (whole
// batches), and returns the server.
func movedVMs(b *testing.B, ctx context.Context, s store.Store, idx *vnatloc.HeldIndex, vms, conns int) *vnatloc.Service {
	b.Helper()
	svc := vnatloc.New(s, vnatloc.Config{Index: idx, Logger: slog.New(slog.DiscardHandler)})
	for v := range vms {
		virt := netip.AddrFrom4([4]byte{10, 1, 1, byte(2 + v)})
		phys := netip.AddrFrom4([4]byte{10, 1, 2, byte(2 + v)})
		var ms []vcmp.Message
		for i := range conns {
			conn := vcmp.Tuple{Proto: vcmp.TCP, Local: netip.AddrPortFrom(virt, uint16(30000+i)), Remote: netip.MustParseAddrPort("10.1.3.2:7100")}
			ms = append(ms, &vcmp.LocStore{Record: vcmp.Record{Conn: conn, Phys: netip.AddrPortFrom(phys, uint16(30000+i))}})
		}
		for i, a := range svc.HandleBatch(ctx, ms, phys) {
			if st := a.(*vcmp.LocAnswer).Status; st != vcmp.LocStored {
				b.Fatalf("vm %d record %d: status %d", v, i, st)
			}
		}
	}
	return svc
}

// BenchmarkHeldAddrs10000Records is what one VM address allocation pays
// to learn the held addresses, with 10,000 live records (100 moved VMs ×
// 100 connections) in an embedded etcd: reading every record (no location
// server in the process) against asking the server's index.
//
//	go test -run '^$' -bench HeldAddrs10000/records -benchtime 50x ./internal/controller/
//	go test -run '^$' -bench HeldAddrs10000/index -benchtime 100000x ./internal/controller/
func BenchmarkHeldAddrs10000Records(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := embeddedStore(b, EtcdOptions{})
	idx := vnatloc.NewHeldIndex(s, nil)
	if err := idx.Start(ctx); err != nil {
		b.Fatal(err)
	}
	movedVMs(b, ctx, s, idx, 100, 100)
	for _, mode := range []string{"records", "index"} {
		b.Run(mode, func(b *testing.B) {
			c := New(s, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if mode == "index" {
				c.loc.index.Store(idx)
			}
			for b.Loop() {
				held, err := c.heldAddrs(ctx)
				if err != nil || len(held) != 200 {
					b.Fatalf("held %d addresses (%v), want 200", len(held), err)
				}
			}
		})
	}
}

// BenchmarkLocationBatch963Refreshes is one daemon's refresh of 963
// records (one VCMP batch) at a location server over an embedded etcd: in
// transactions of 128 records, against one write per record (transactions
// of one, what the server did before).
//
//	go test -run '^$' -bench Batch963 -benchtime 10x ./internal/controller/
func BenchmarkLocationBatch963Refreshes(b *testing.B) {
	ctx := context.Background()
	s := embeddedStore(b, EtcdOptions{})
	for _, max := range []int{store.MaxTxnOps, 1} {
		b.Run(fmt.Sprintf("txn=%d", max), func(b *testing.B) {
			svc := vnatloc.New(s, vnatloc.Config{MaxTxnOps: max, MaxPerSource: 1000, Logger: slog.New(slog.DiscardHandler)})
			phys := netip.MustParseAddr("10.1.2.9")
			var ms []vcmp.Message
			for i := range 963 {
				conn := vcmp.Tuple{Proto: vcmp.TCP, Local: netip.AddrPortFrom(netip.MustParseAddr("10.1.1.9"), uint16(20000+i)), Remote: netip.MustParseAddrPort("10.1.3.2:7100")}
				ms = append(ms, &vcmp.LocStore{Record: vcmp.Record{Conn: conn, Phys: netip.AddrPortFrom(phys, uint16(20000+i))}})
			}
			start := time.Now()
			for b.Loop() {
				for i, a := range svc.HandleBatch(ctx, ms, phys) {
					if st := a.(*vcmp.LocAnswer).Status; st != vcmp.LocStored {
						b.Fatalf("record %d: status %d", i, st)
					}
				}
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N)/963, "µs/record")
		})
	}
}

// TestLocationBatchOverEtcdIsHeldAtOnceAndByAnotherController runs the
// location server over a real (embedded) etcd: a batch of 300 records is
// written in 3 transactions (etcd's own Txn, revision bumped 3 times), the
// server's index holds them at once, and a second controller's index,
// which only the watch feeds, holds the same set once its watch caught up;
// after a release batch both free the address.
func TestLocationBatchOverEtcdIsHeldAtOnceAndByAnotherController(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := embeddedStore(t, EtcdOptions{})
	mine, other := vnatloc.NewHeldIndex(s, nil), vnatloc.NewHeldIndex(s, nil)
	for _, x := range []*vnatloc.HeldIndex{mine, other} {
		if err := x.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	svc := vnatloc.New(s, vnatloc.Config{Index: mine, Logger: slog.New(slog.DiscardHandler)})
	virt, phys := netip.MustParseAddr("10.1.1.2"), netip.MustParseAddr("10.1.2.2")
	var stores, releases []vcmp.Message
	for i := range 300 {
		conn := vcmp.Tuple{Proto: vcmp.TCP, Local: netip.AddrPortFrom(virt, uint16(30000+i)), Remote: netip.MustParseAddrPort("10.1.3.2:7100")}
		stores = append(stores, &vcmp.LocStore{Record: vcmp.Record{Conn: conn, Phys: netip.AddrPortFrom(phys, uint16(30000+i))}})
		releases = append(releases, vcmp.Release(conn))
	}
	rev := func() int64 {
		_, r, err := s.List(ctx, "/onehop/none/")
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, step := range []struct {
		name string
		ms   []vcmp.Message
		want vcmp.LocStatus
		held bool
	}{{"store", stores, vcmp.LocStored, true}, {"release", releases, vcmp.LocNotFound, false}} {
		r0 := rev()
		for i, a := range svc.HandleBatch(ctx, step.ms, phys) {
			if a.(*vcmp.LocAnswer).Status != step.want {
				t.Fatalf("%s: answer %d status %d, want %d", step.name, i, a.(*vcmp.LocAnswer).Status, step.want)
			}
		}
		if n := rev() - r0; n != 3 {
			t.Fatalf("%s of 300 records: etcd revision moved %d, want 3 transactions", step.name, n)
		}
		h, err := mine.HeldAt(ctx, time.Now())
		if err != nil || h[virt] != step.held || h[phys] != step.held {
			t.Fatalf("%s: the server's index at once: %v %v, want %v and %v held: %v", step.name, vnatloc.HeldList(h), err, virt, phys, step.held)
		}
		want := h
		testenv.Eventually(t, step.name+" in the other controller's index", 10*time.Second, func() error {
			h, err := other.HeldAt(ctx, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if h[virt] == step.held && h[phys] == step.held && len(h) == len(want) {
				return nil
			}
			return fmt.Errorf("it holds %v", vnatloc.HeldList(h))
		})
	}
}
