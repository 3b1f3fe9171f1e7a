package vnatloc

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/vcmp"
)

// TestABatchIsDecidedAsOneRecordAtATime: random batches (stores, refreshes,
// releases, queries, refusals of every kind, one key several times in a
// batch) given to a server whole, with small transactions, and to another
// one message at a time, get the same answers, leave the same records in
// the store and count the same.
func TestABatchIsDecidedAsOneRecordAtATime(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 13))
	ctx := context.Background()
	c := &clock{t: time.Unix(1_000_000, 0)}
	cfg := Config{Now: c.now, Lifetime: 60 * time.Second, MaxRecords: 300, MaxPerSource: 40, MaxHeldPerSource: 5, Logger: slog.New(slog.DiscardHandler)}
	stWhole, stOne := store.NewMemory(), store.NewMemory()
	cfgWhole := cfg
	cfgWhole.MaxTxnOps = 7
	whole, one := New(stWhole, cfgWhole), New(stOne, cfg)
	vm := func() netip.Addr {
		return netip.AddrFrom4([4]byte{10, 1, byte(1 + rng.IntN(2)), byte(2 + rng.IntN(8))})
	}
	var batches, records int
	for step := range 400 {
		if rng.IntN(10) == 0 {
			c.t = c.t.Add(time.Duration(rng.IntN(40)) * time.Second)
		}
		src := vm()
		var ms []vcmp.Message
		for range 1 + rng.IntN(60) {
			tp := vcmp.Tuple{Proto: vcmp.TCP, Local: netip.AddrPortFrom(vm(), uint16(40000+rng.IntN(4))), Remote: netip.AddrPortFrom(vm(), 7100)}
			phys := netip.AddrPortFrom(src, tp.Local.Port())
			switch k := rng.IntN(12); {
			case k < 5:
				ms = append(ms, &vcmp.LocStore{Record: vcmp.Record{Conn: tp, Phys: phys}})
			case k < 7:
				ms = append(ms, vcmp.Release(tp))
			case k < 9: // from the peer's end: finds tp's record if there is one
				ms = append(ms, &vcmp.LocQuery{Record: vcmp.Record{Conn: tp.Reverse(), Phys: netip.AddrPortFrom(src, 7100)}, Store: rng.IntN(2) == 0})
			case k < 10:
				ms = append(ms, &vcmp.LocStore{Record: vcmp.Record{Conn: vcmp.Tuple{Proto: vcmp.UDP, Local: tp.Local, Remote: tp.Local}, Phys: phys}}) // invalid
			case k < 11:
				ms = append(ms, &vcmp.LocStore{Record: vcmp.Record{Conn: tp, Phys: netip.AddrPortFrom(vm(), 9)}}) // source, mostly
			default:
				ms = append(ms, &vcmp.UpdateReply{}) // not a location message
			}
		}
		got := whole.HandleBatch(ctx, ms, src)
		for i, m := range ms {
			want := one.Handle(ctx, m, src)
			g := got[i].(*vcmp.LocAnswer)
			if g.Status != want.Status || g.Peer != want.Peer || g.Record != want.Record {
				t.Fatalf("step %d, message %d of %d (%T from %v): batch answered %+v, one at a time %+v", step, i, len(ms), m, src, *g, *want)
			}
		}
		batches++
		records += len(ms)
	}
	a, _, _ := stWhole.List(ctx, Prefix)
	b, _, _ := stOne.List(ctx, Prefix)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("the store holds %d records after batches, %d after one at a time", len(a), len(b))
	}
	if fmt.Sprint(whole.Counters()) != fmt.Sprint(one.Counters()) {
		t.Fatalf("counters after batches %v\none at a time %v", whole.Counters(), one.Counters())
	}
	cn := whole.Counters()
	for _, k := range []string{"stored", "refreshed", "released", "refused_owner", "refused_source", "refused_invalid", "refused_held_full", "refused_source_full", "refused_full", "refused_command", "answered_found"} {
		if cn[k] == 0 {
			t.Errorf("counter %s never counted: the test does not exercise it", k)
		}
	}
	t.Logf("%d batches, %d messages, %d records held; store writes: %d whole, %d one at a time", batches, records, len(a), stWhole.Writes(), stOne.Writes())
}

// TestABatchOfRecordsIsOneTransactionPerMaxTxnOps: 300 records of one
// daemon in one batch cost three store writes (128 + 128 + 44), stored,
// refreshed and released; one at a time they cost 300 each.
func TestABatchOfRecordsIsOneTransactionPerMaxTxnOps(t *testing.T) {
	ctx := context.Background()
	st := &countingStore{Memory: store.NewMemory()}
	c := &clock{t: time.Unix(1_000_000, 0)}
	x := startIndex(t, ctx, st)
	s := New(st, Config{Now: c.now, Index: x, Logger: slog.New(slog.DiscardHandler)})
	var stores, releases []vcmp.Message
	for i := range 300 {
		conn := vcmp.Tuple{Proto: vcmp.TCP, Local: netip.AddrPortFrom(web1Conn.Local.Addr(), uint16(30000+i)), Remote: web1Conn.Remote}
		stores = append(stores, &vcmp.LocStore{Record: vcmp.Record{Conn: conn, Phys: netip.AddrPortFrom(web1Now.Addr(), uint16(30000+i))}})
		releases = append(releases, vcmp.Release(conn))
	}
	for _, tc := range []struct {
		name    string
		ms      []vcmp.Message
		want    vcmp.LocStatus
		counter string
		held    bool
	}{
		{"store", stores, vcmp.LocStored, "stored", true},
		{"refresh", stores, vcmp.LocStored, "refreshed", true},
		{"release", releases, vcmp.LocNotFound, "released", false},
	} {
		w0, t0 := st.Writes(), st.txns.Load()
		for i, a := range s.HandleBatch(ctx, tc.ms, web1Now.Addr()) {
			if a.(*vcmp.LocAnswer).Status != tc.want {
				t.Fatalf("%s: answer %d status %d, want %d", tc.name, i, a.(*vcmp.LocAnswer).Status, tc.want)
			}
		}
		if w, n := st.Writes()-w0, st.txns.Load()-t0; w != 3 || n != 3 {
			t.Fatalf("%s of 300 records: %d store writes in %d transactions, want 3 (128+128+44)", tc.name, w, n)
		}
		if got := s.Counters()[tc.counter]; got != 300 {
			t.Fatalf("%s: counter %s %d, want 300", tc.name, tc.counter, got)
		}
		h, err := x.HeldAt(ctx, c.t)
		if err != nil || h[web1Conn.Local.Addr()] != tc.held {
			t.Fatalf("%s: held %v %v, want %v held: %v", tc.name, HeldList(h), err, web1Conn.Local.Addr(), tc.held)
		}
	}
}

// TestAFailedTransactionRefusesItsRecordsAndUndoesThem: when the store
// refuses a batch's transaction, each record of it is answered refused and
// counted (store_errors), and the server and the index are as before it: a
// new record is not there, a released one still is. Once the store works,
// the same batch is stored.
func TestAFailedTransactionRefusesItsRecordsAndUndoesThem(t *testing.T) {
	ctx := context.Background()
	st := &countingStore{Memory: store.NewMemory()}
	c := &clock{t: time.Unix(1_000_000, 0)}
	x := startIndex(t, ctx, st)
	s := New(st, Config{Now: c.now, Index: x, Logger: slog.New(slog.DiscardHandler)})
	if a := s.Handle(ctx, &vcmp.LocStore{Record: vcmp.Record{Conn: web1Conn, Phys: web1Now}}, web1Now.Addr()); a.Status != vcmp.LocStored {
		t.Fatalf("store: %d", a.Status)
	}
	other := vcmp.Tuple{Proto: vcmp.UDP, Local: netip.MustParseAddrPort("10.1.1.7:5000"), Remote: web1Conn.Remote}
	ms := []vcmp.Message{
		vcmp.Release(web1Conn),
		&vcmp.LocStore{Record: vcmp.Record{Conn: other, Phys: netip.AddrPortFrom(web1Now.Addr(), 5000)}},
		&vcmp.LocStore{Record: vcmp.Record{Conn: web1Conn, Phys: netip.MustParseAddrPort("10.1.9.9:1")}}, // refused: source
	}
	st.failTxn.Store(true)
	for i, a := range s.HandleBatch(ctx, ms, web1Now.Addr()) {
		if a.(*vcmp.LocAnswer).Status != vcmp.LocRefused {
			t.Fatalf("store failing: answer %d status %d, want refused", i, a.(*vcmp.LocAnswer).Status)
		}
	}
	cn := s.Counters()
	if cn["store_errors"] != 2 || cn["refused_source"] != 1 || cn["released"] != 0 || cn["stored"] != 1 || cn["answered_refused"] != 3 {
		t.Fatalf("counters %v, want store_errors 2, refused_source 1, released 0, stored 1, answered_refused 3", cn)
	}
	if stt, at := query(t, s, web1Conn.Reverse(), netip.MustParseAddrPort("10.1.2.2:7100"), false); stt != vcmp.LocFound || at != web1Now {
		t.Fatalf("web1's record after a failed release: %d %v, want found at %v", stt, at, web1Now)
	}
	if stt, _ := query(t, s, other.Reverse(), netip.MustParseAddrPort("10.1.2.2:7100"), false); stt != vcmp.LocNotFound {
		t.Fatalf("a record whose store failed: %d, want not found", stt)
	}
	if s.Len() != 1 {
		t.Fatalf("server holds %d records, want 1", s.Len())
	}
	sameHeld(t, "after the failed transaction", x, st, c.t)
	st.failTxn.Store(false)
	want := []vcmp.LocStatus{vcmp.LocNotFound, vcmp.LocStored, vcmp.LocRefused}
	for i, a := range s.HandleBatch(ctx, ms, web1Now.Addr()) {
		if a.(*vcmp.LocAnswer).Status != want[i] {
			t.Fatalf("store working: answer %d status %d, want %d", i, a.(*vcmp.LocAnswer).Status, want[i])
		}
	}
	sameHeld(t, "after the batch went through", x, st, c.t)
	kvs, _, _ := st.List(ctx, Prefix)
	var got Stored
	if b, ok := kvs[Key(other)]; !ok || json.Unmarshal(b, &got) != nil || got.Phys != "10.1.2.3:5000" {
		t.Fatalf("store holds %v, want only %v at 10.1.2.3:5000", kvs, other)
	}
	if len(kvs) != 1 {
		t.Fatalf("store holds %d records, want 1", len(kvs))
	}
}
