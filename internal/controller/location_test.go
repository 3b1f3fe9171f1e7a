package controller

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/pki/pkitest"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/testenv"
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

// TestASliverCannotRelayForItsHostsVMs: slivers share their host's
// address, so the location server takes a relay (VCMP_RELAY) only on the
// agents' channel, TLS with the certificate of the VM's host. The control
// first: h1's agent relays db1 (red, on h1), whose record is stored, and
// /metrics counts the relayed stream. Then a sliver on h1, from h1's very
// address, names db1 in a plain VCMP_RELAY to withdraw its record, and
// h2's agent names db1 too: both streams are closed unanswered, counted
// on /metrics (refused_relay) and db1's record stays. Before the fix the
// sliver's release was taken (relays were checked by source address).
func TestASliverCannotRelayForItsHostsVMs(t *testing.T) {
	c, s := newController()
	for name, addr := range map[string]string{"h1": "127.0.0.1", "h2": "127.0.0.2"} {
		if err := store.PutJSON(t.Context(), s, intent.HostsPrefix+name, intent.Host{Name: name, Address: addr}); err != nil {
			t.Fatal(err)
		}
	}
	api := httptest.NewServer(c.API())
	t.Cleanup(api.Close)
	mustCall(t, api, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	mustCall(t, api, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`, 201)
	mustCall(t, api, "POST", "/v1/farms", `{"name":"red"}`, 201)
	mustCall(t, api, "POST", "/v1/farms/red/subnets", `{"name":"db"}`, 201)
	mustCall(t, api, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web1","host":"h1"}`, 201)
	db1 := netip.MustParseAddr(mustCall(t, api, "POST", "/v1/farms/red/subnets/db/vms", `{"name":"db1","host":"h1"}`, 201)["ip"].(string))

	p := pkitest.New(t)
	addr, err := c.serveLocations(t.Context(), "127.0.0.1:0", accept.Limits{}, p.ServerConfig(), c.log)
	if err != nil {
		t.Fatal(err)
	}
	relay := func(cfg *tls.Config, msgs ...vcmp.Message) ([]vcmp.Message, error) {
		conn, err := net.Dial("tcp4", addr.String())
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
		if cfg != nil {
			conn = tls.Client(conn, cfg)
		}
		if err := vcmp.WriteMessage(conn, &vcmp.Relay{Source: db1}); err != nil {
			return nil, err
		}
		return vcmp.Exchange(conn, msgs)
	}
	conn := vcmp.Tuple{Proto: vcmp.TCP, Local: netip.AddrPortFrom(db1, 5432), Remote: netip.MustParseAddrPort("10.2.1.9:40000")}
	ans, err := relay(p.Agent("h1"), &vcmp.LocStore{Record: vcmp.Record{Conn: conn, Phys: netip.AddrPortFrom(db1, 5432)}})
	if err != nil {
		t.Fatalf("h1's agent relaying db1: %v", err)
	}
	if st := ans[0].(*vcmp.LocAnswer).Status; st != vcmp.LocStored {
		t.Fatalf("db1's record through h1's agent: %d, want stored", st)
	}
	event := func(e string) string {
		return metric(t, api.URL, `onehop_vnat_location_events_total{event="`+e+`"}`)
	}
	if event("relayed_streams") != "1" || event("stored") != "1" || event("refused_relay") != "0" {
		t.Fatalf("after the control: relayed_streams %s, stored %s, refused_relay %s; want 1, 1, 0",
			event("relayed_streams"), event("stored"), event("refused_relay"))
	}

	for i, a := range []struct {
		name string
		cfg  *tls.Config
	}{{"a sliver on h1, plain, from h1's address", nil}, {"h2's agent", p.Agent("h2")}} {
		if _, err := relay(a.cfg, vcmp.Release(conn)); err == nil {
			t.Fatalf("%s: withdrawing db1's record was answered", a.name)
		}
		want := fmt.Sprint(i + 1)
		testenv.Eventually(t, a.name+" counted", 10*time.Second, func() bool { return event("refused_relay") == want })
		if _, err := s.Get(t.Context(), vnatloc.Key(conn)); err != nil {
			t.Fatalf("after %s: db1's record: %v", a.name, err)
		}
	}
	if event("relayed_streams") != "1" || event("released") != "0" {
		t.Fatalf("relayed_streams %s, released %s: want 1 and 0", event("relayed_streams"), event("released"))
	}
}

// TestOnlyAVMThatHeldAnAddressClaimsItAtTheLocationServer: a VM moved to
// another subnet keeps its old address in intent (Former), and the
// location server stores a record claiming an address away from its
// source only for the VM intent gives it to, or gave it to before. The
// control: web1, moved from 10.1.1.2, stores its connection's record.
// Then a thief VM of the same farm claims db2's live address and one
// nobody ever held: refused, counted, and neither is held from the
// allocator. Before the fix both were stored (only the farm was checked).
func TestOnlyAVMThatHeldAnAddressClaimsItAtTheLocationServer(t *testing.T) {
	c, s := newController()
	putHost(t, s, "h1")
	putHost(t, s, "h2")
	api := httptest.NewServer(c.API())
	t.Cleanup(api.Close)
	mustCall(t, api, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	for _, sn := range []string{"web", "app"} {
		mustCall(t, api, "POST", "/v1/farms/blue/subnets", `{"name":"`+sn+`"}`, 201)
	}
	mustCall(t, api, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web1","host":"h1"}`, 201)
	mustCall(t, api, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"db2","host":"h1"}`, 201)
	thief := netip.MustParseAddr(mustCall(t, api, "POST", "/v1/farms/blue/subnets/app/vms", `{"name":"thief","host":"h2"}`, 201)["ip"].(string))
	out := mustCall(t, api, "PUT", "/v1/farms/blue/subnets/web/vms/web1/host", `{"host":"h2","subnet":"blue/app"}`, 200)
	web1 := netip.MustParseAddr(out["ip"].(string))
	if f, _ := out["former"].([]any); len(f) != 1 || f[0] != "10.1.1.2" {
		t.Fatalf("web1 moved: former %v, want [10.1.1.2]", out["former"])
	}

	loc := vnatloc.New(s, c.locationConfig())
	peer := netip.MustParseAddrPort("10.1.2.200:7100")
	claim := func(local string, from netip.Addr) vcmp.LocStatus {
		conn := vcmp.Tuple{Proto: vcmp.TCP, Local: netip.MustParseAddrPort(local), Remote: peer}
		return loc.Handle(t.Context(), &vcmp.LocStore{Record: vcmp.Record{Conn: conn, Phys: netip.AddrPortFrom(from, 40000)}}, from).Status
	}
	if st := claim("10.1.1.2:40000", web1); st != vcmp.LocStored {
		t.Fatalf("web1 claiming its former address: %d, want stored", st)
	}
	for i, local := range []string{"10.1.1.3:40000", "10.1.1.200:40000", "10.1.1.2:41000"} {
		if st := claim(local, thief); st != vcmp.LocRefused {
			t.Fatalf("the thief claiming %s: %d, want refused", local, st)
		}
		if got := loc.Counters()["refused_holder"]; got != uint64(i+1) {
			t.Fatalf("refused_holder %d after the thief claimed %s, want %d", got, local, i+1)
		}
	}
	held, err := c.heldAddrs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !held[netip.MustParseAddr("10.1.1.2")] || held[netip.MustParseAddr("10.1.1.3")] || held[netip.MustParseAddr("10.1.1.200")] {
		t.Fatalf("held %s: want web1's 10.1.1.2, neither of the thief's claims", vnatloc.HeldList(held))
	}
}
