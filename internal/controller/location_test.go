package controller

import (
	"context"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/vcmp"
	"github.com/onehop/onehop/internal/vnatloc"
)

// TestAddressHeldByAVNATEndpointIsNotHandedOut replays §3.4.2 at the
// controller: web1 (10.1.1.2) moves to blue/db and its daemon stores where
// its connection now is; db1 then moved into blue/web, and a VM created
// there, get other addresses than 10.1.1.2 while the record lives. Once it
// is released (or expires) the address is free again. Without the hook
// db1 gets 10.1.1.2, the address web1's connection still uses virtually.
//
// It runs twice: heldAddrs reading every record (no location server in
// the process) and asking the server's index (it runs), where the store
// and the release must count at once, before the index's watch could
// bring them.
func TestAddressHeldByAVNATEndpointIsNotHandedOut(t *testing.T) {
	t.Run("records", func(t *testing.T) { addressHeldNotHandedOut(t, false) })
	t.Run("index", func(t *testing.T) { addressHeldNotHandedOut(t, true) })
}

func addressHeldNotHandedOut(t *testing.T, withIndex bool) {
	c, s := newController()
	putHost(t, s, "h1")
	putHost(t, s, "h2")
	srv := httptest.NewServer(c.API())
	t.Cleanup(srv.Close)
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	for _, sn := range []string{"web", "db", "app"} {
		mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"`+sn+`"}`, 201)
	}
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web1","host":"h1"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/db/vms", `{"name":"db1","host":"h2"}`, 201)
	out := mustCall(t, srv, "PUT", "/v1/farms/blue/subnets/web/vms/web1/host", `{"host":"h2","subnet":"blue/app"}`, 200)
	if out["ip"] != "10.1.3.2" {
		t.Fatalf("web1 moved to %v, want 10.1.3.2", out["ip"])
	}

	// web1's daemon, now at 10.1.3.2, stores its connection with db1.
	now := time.Now()
	var idx *vnatloc.HeldIndex
	if withIndex {
		// The index follows a store whose watch never delivers, so only
		// the server's own commits can reach it.
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		idx = vnatloc.NewHeldIndex(silentWatch{s}, nil)
		if err := idx.Start(ctx); err != nil {
			t.Fatal(err)
		}
		c.loc.index.Store(idx)
	}
	loc := vnatloc.New(s, vnatloc.Config{Now: func() time.Time { return now }, Lifetime: time.Minute, Index: idx})
	conn := vcmp.Tuple{Proto: vcmp.TCP, Local: netip.MustParseAddrPort("10.1.1.2:40000"), Remote: netip.MustParseAddrPort("10.1.2.2:7100")}
	if a := loc.Handle(context.Background(), &vcmp.LocStore{Record: vcmp.Record{Conn: conn, Phys: netip.MustParseAddrPort("10.1.3.2:40000")}},
		netip.MustParseAddr("10.1.3.2")); a.Status != vcmp.LocStored {
		t.Fatalf("store: status %d", a.Status)
	}

	out = mustCall(t, srv, "PUT", "/v1/farms/blue/subnets/db/vms/db1/host", `{"host":"h1","subnet":"blue/web"}`, 200)
	if out["ip"] == "10.1.1.2" || out["ip"] != "10.1.1.3" {
		t.Fatalf("db1 moved into blue/web got %v, want 10.1.1.3 (10.1.1.2 is held by web1's connection)", out["ip"])
	}
	out = mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web2","host":"h1"}`, 201)
	if out["ip"] != "10.1.1.4" {
		t.Fatalf("web2 created in blue/web got %v, want 10.1.1.4", out["ip"])
	}
	// web1's connection closes: its daemon releases the record, and the
	// address is free again at once (an unreleased one frees when it
	// expires: vnatloc's TestLocationRecordExpiresUnlessRefreshed).
	if a := loc.Handle(context.Background(), vcmp.Release(conn), netip.MustParseAddr("10.1.3.2")); a.Status != vcmp.LocNotFound {
		t.Fatalf("release: status %d", a.Status)
	}
	out = mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web3","host":"h1"}`, 201)
	if out["ip"] != "10.1.1.2" {
		t.Fatalf("web3 created after the release got %v, want 10.1.1.2 (free again)", out["ip"])
	}
	if withIndex && !idx.Synced() {
		t.Fatal("the index stopped following the store: heldAddrs read the records instead")
	}
}

// silentWatch is a store whose event watch stays open and brings nothing.
type silentWatch struct{ *store.Memory }

func (silentWatch) WatchEvents(ctx context.Context, _ string, _ int64) <-chan store.Batch {
	return make(chan store.Batch)
}
