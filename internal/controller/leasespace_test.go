package controller

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/onehop/onehop/internal/egressspec"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// Two controllers on one store (each with its own lock and its own model,
// as two controller processes on one etcd): one gives VMs egress slices
// while the other leases the same ports to slivers. Every port of the
// host's address ends with one holder at most, and every refusal names
// the overlap or the room left.
func TestConcurrentSliceAndSliverWritersNeverShareAPort(t *testing.T) {
	testConcurrentLeaseWriters(t, store.NewMemory())
}

// The same on a real etcd: the lease space key's compare is one etcd
// transaction with the record it guards.
func TestConcurrentSliceAndSliverWritersOnEtcdNeverShareAPort(t *testing.T) {
	testConcurrentLeaseWriters(t, embeddedStore(t, EtcdOptions{}))
}

func testConcurrentLeaseWriters(t *testing.T, s store.Store) {
	t.Helper()
	ctx := context.Background()
	if err := store.PutJSON(ctx, s, intent.HostsPrefix+"h1", intent.Host{Name: "h1"}); err != nil {
		t.Fatal(err)
	}
	putNode(t, s, "h1", 1, 32768, 60999)
	a, b := New(s, quietLog()), New(s, quietLog())
	if _, err := a.CreateFarm(ctx, "blue", false); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CreateSubnet(ctx, "blue", "web"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetFarmEgress(ctx, "blue", egressspec.Setting{Enabled: true, Slice: 16}); err != nil {
		t.Fatal(err)
	}
	// The slivers ask for ports the slices pack into (the first half) and
	// past them (the second half, which no slice reaches).
	const n = 24
	errs := make(chan error, 3*n+1)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		for i := range n {
			_, err := a.CreateVM(ctx, "blue", "web", fmt.Sprintf("vm%d", i), "h1")
			if err != nil && !strings.Contains(err.Error(), "kept changing") {
				errs <- fmt.Errorf("vm%d: %w", i, err)
			}
		}
	}()
	go func() {
		defer wg.Done()
		for i := range 2 * n {
			lo := 1024 + 32*i
			_, err := b.CreateSliver(ctx, "h1", fmt.Sprintf("s%d", i), fmt.Sprintf("%d-%d", lo, lo+15))
			if err != nil && !strings.Contains(err.Error(), "overlap") && !strings.Contains(err.Error(), "kept changing") {
				errs <- fmt.Errorf("s%d: %w", i, err)
			}
		}
	}()
	go func() {
		// The farm's slices are resized meanwhile, by the sliver writer's
		// controller: every VM's slice is decided again.
		defer wg.Done()
		if _, err := b.SetFarmEgress(ctx, "blue", egressspec.Setting{Enabled: true, Slice: 32}); err != nil && !strings.Contains(err.Error(), "kept changing") {
			errs <- fmt.Errorf("resize: %w", err)
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	holders := map[uint16]string{}
	take := func(who string, l intent.Lease) {
		for p := uint32(l.Lo); p <= uint32(l.Hi); p++ {
			if other, dup := holders[uint16(p)]; dup {
				t.Fatalf("port %d held by %s and %s", p, other, who)
			}
			holders[uint16(p)] = who
		}
	}
	slivers, _, err := store.ListJSON[intent.Sliver](ctx, s, intent.HostSliversPrefix("h1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, sl := range slivers {
		for _, l := range sl.Leases {
			take("sliver "+sl.Name, l)
		}
	}
	vms, _, err := store.ListJSON[intent.VM](ctx, s, intent.VMsPrefix)
	if err != nil {
		t.Fatal(err)
	}
	sliced := 0
	for _, v := range vms {
		if v.Egress != nil {
			take("vm "+v.FullName(), v.Egress.Slice)
			sliced++
		}
	}
	if len(slivers) == 0 || sliced == 0 {
		t.Fatalf("%d slivers and %d slices stored: the race was not run", len(slivers), sliced)
	}
	t.Logf("%d slivers, %d slices, %d ports held, none twice", len(slivers), sliced, len(holders))
}
