package vnatloc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/testenv"
	"github.com/onehop/onehop/internal/vcmp"
)

// countingStore counts the store's lists and transactions, and fails its
// transactions while failTxn is set.
type countingStore struct {
	*store.Memory
	lists   atomic.Int64
	txns    atomic.Int64
	failTxn atomic.Bool
	// afterList runs once, after the next list read the store and before
	// it returns: a write racing the list.
	afterList func()
}

func (c *countingStore) List(ctx context.Context, prefix string) (map[string][]byte, int64, error) {
	c.lists.Add(1)
	kvs, rev, err := c.Memory.List(ctx, prefix)
	if f := c.afterList; f != nil {
		c.afterList = nil
		f()
	}
	return kvs, rev, err
}

func (c *countingStore) Txn(ctx context.Context, ops []store.Op) (int64, error) {
	c.txns.Add(1)
	if c.failTxn.Load() {
		return 0, errors.New("etcdserver: request timed out")
	}
	return c.Memory.Txn(ctx, ops)
}

func startIndex(t testing.TB, ctx context.Context, s store.Store) *HeldIndex {
	t.Helper()
	x := NewHeldIndex(s, slog.New(slog.DiscardHandler))
	if err := x.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return x
}

// awaitSeen waits until the index's watch brought revision rev.
func awaitSeen(t testing.TB, x *HeldIndex, rev int64) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("the index watch at revision %d", rev), 10*time.Second, func() error {
		x.mu.Lock()
		seen := x.seen
		x.mu.Unlock()
		if seen < rev {
			return fmt.Errorf("at revision %d", seen)
		}
		return nil
	})
}

// sameHeld fails unless the index holds every address Held, read from
// the store, holds (never less: an allocation must not hand one out),
// and, once the index's watch brought the store's last change, exactly
// those (it may hold more only until then: a record deleted by a plain
// store write, the sweep's, leaves the index when the watch brings it).
func sameHeld(t testing.TB, step string, x *HeldIndex, st *countingStore, now time.Time) map[netip.Addr]bool {
	t.Helper()
	ctx := context.Background()
	want, err := Held(ctx, st, now)
	if err != nil {
		t.Fatal(err)
	}
	got, err := x.HeldAt(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	for a := range want {
		if !got[a] {
			t.Fatalf("%s: index holds [%s], without %v, which the store's records [%s] hold", step, HeldList(got), a, HeldList(want))
		}
	}
	awaitSeen(t, x, st.Rev())
	if got, err = x.HeldAt(ctx, now); err != nil {
		t.Fatal(err)
	}
	if HeldList(got) != HeldList(want) {
		t.Fatalf("%s: once the watch caught up, index holds [%s], the store's records [%s]", step, HeldList(got), HeldList(want))
	}
	return got
}

// TestHeldIndexIsHeldFromTheStoreRandomized drives a server with the
// index, and a second writer straight into the store (another controller,
// garbage, records that expire), at random, and compares the index's held
// set with Held's after every step (sameHeld). After the server's own
// batches, and after a restart, the index must hold at least Held's set at
// once, without waiting for the watch: an allocation right after a store
// must see it. The other writer's changes reach the index by the watch,
// and are compared once it brought them.
func TestHeldIndexIsHeldFromTheStoreRandomized(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { heldIndexRandomized(t, seed, 1500) })
	}
}

func heldIndexRandomized(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 7))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st := &countingStore{Memory: store.NewMemory()}
	c := &clock{t: time.Unix(1_000_000, 0)}
	x := startIndex(t, ctx, st)
	newServer := func(x *HeldIndex) *Service {
		return New(st, Config{Now: c.now, Lifetime: 60 * time.Second, Index: x, MaxTxnOps: 1 + rng.IntN(10),
			MaxHeldPerSource: 6, Logger: slog.New(slog.DiscardHandler)})
	}
	s := newServer(x)
	// A small farm, so records collide, move and overlap.
	vm := func() netip.Addr {
		return netip.AddrFrom4([4]byte{10, 1, byte(1 + rng.IntN(2)), byte(2 + rng.IntN(5))})
	}
	ext := func() netip.Addr { return netip.AddrFrom4([4]byte{192, 168, 100, byte(50 + rng.IntN(5))}) }
	port := func() uint16 { return uint16(40000 + rng.IntN(3)) }
	randTuple := func(tenant bool) vcmp.Tuple {
		a, b := vm, vm
		if !tenant {
			a, b = ext, ext
		}
		tp := vcmp.Tuple{Proto: vcmp.TCP, Local: netip.AddrPortFrom(a(), port()), Remote: netip.AddrPortFrom(b(), 7100)}
		if rng.IntN(3) == 0 {
			tp.Proto = vcmp.UDP
		}
		return tp
	}
	holding := 0
	for i := range steps {
		step := fmt.Sprintf("step %d", i)
		switch r := rng.IntN(20); {
		case r < 10: // a batch from one source
			tenant := rng.IntN(4) != 0
			src := ext()
			if tenant {
				src = vm()
			}
			var ms []vcmp.Message
			for range 1 + rng.IntN(20) {
				tp := randTuple(tenant)
				if rng.IntN(8) == 0 {
					tp = randTuple(!tenant) // refused: space
				}
				phys := netip.AddrPortFrom(src, tp.Local.Port())
				switch k := rng.IntN(10); {
				case k < 5:
					ms = append(ms, &vcmp.LocStore{Record: vcmp.Record{Conn: tp, Phys: phys}})
				case k < 7:
					ms = append(ms, vcmp.Release(tp))
				case k < 9:
					ms = append(ms, &vcmp.LocQuery{Record: vcmp.Record{Conn: tp, Phys: phys}, Store: true})
				default:
					ms = append(ms, &vcmp.LocStore{Record: vcmp.Record{Conn: tp, Phys: netip.AddrPortFrom(vm(), 1)}}) // refused unless it is src
				}
			}
			s.HandleBatch(ctx, ms, src)
			// At once: the server applied its commits to the index.
			if len(sameHeld(t, step+" (server batch)", x, st, c.t)) > 0 {
				holding++
			}
		case r < 15: // another writer, straight into the store
			tp := randTuple(rng.IntN(3) != 0)
			switch k := rng.IntN(10); {
			case k < 6:
				phys := netip.AddrPortFrom(vm(), 1)
				if rng.IntN(4) == 0 {
					phys = tp.Local // not moved: holds nothing
				}
				b, err := json.Marshal(Stored{Proto: tp.Proto.String(), Local: tp.Local.String(), Remote: tp.Remote.String(),
					Phys: phys.String(), Owner: "addr:other", Expires: c.t.Add(time.Duration(rng.IntN(90)-10) * time.Second).UTC()})
				if err != nil {
					t.Fatal(err)
				}
				if err := st.Put(ctx, Key(tp), b); err != nil {
					t.Fatal(err)
				}
			case k < 8:
				kvs, _, err := st.Memory.List(ctx, Prefix)
				if err != nil {
					t.Fatal(err)
				}
				for k := range kvs {
					if err := st.Delete(ctx, k); err != nil {
						t.Fatal(err)
					}
					break
				}
			case k < 9:
				if err := st.Put(ctx, Key(tp), []byte("{not json")); err != nil {
					t.Fatal(err)
				}
			default: // a record under another connection's key
				b, _ := json.Marshal(Stored{Proto: "tcp", Local: "10.1.1.2:1", Remote: "10.1.1.3:2", Phys: "10.1.2.2:1", Owner: "x", Expires: c.t.Add(time.Minute)})
				if err := st.Put(ctx, Key(tp), b); err != nil {
					t.Fatal(err)
				}
			}
			awaitSeen(t, x, st.Rev())
			sameHeld(t, step+" (other writer)", x, st, c.t)
		case r < 18:
			c.t = c.t.Add(time.Duration(rng.IntN(30_000)) * time.Millisecond)
			sameHeld(t, step+" (time passed)", x, st, c.t)
		case r < 19:
			if _, err := s.Sweep(ctx); err != nil {
				t.Fatal(err)
			}
			sameHeld(t, step+" (sweep)", x, st, c.t)
		default: // the controller restarts: a new index and server
			cancel()
			ctx, cancel = context.WithCancel(context.Background())
			t.Cleanup(cancel)
			x = startIndex(t, ctx, st)
			s = newServer(x)
			if err := s.Load(ctx); err != nil {
				t.Fatal(err)
			}
			sameHeld(t, step+" (restart)", x, st, c.t)
		}
	}
	if holding < steps/20 {
		t.Fatalf("only %d of %d server batches left addresses held: the test did not exercise the index", holding, steps)
	}
	t.Logf("%d server batches left addresses held", holding)
}

// TestHeldIndexAnswersWithoutListing: a started index answers from memory
// (no list of the records); one not started, or whose watch ended, reads
// the store, so it never answers from a state it does not follow.
func TestHeldIndexAnswersWithoutListing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := &countingStore{Memory: store.NewMemory()}
	c := &clock{t: time.Unix(1_000_000, 0)}
	idle := NewHeldIndex(st, nil)
	x := startIndex(t, ctx, st)
	s := New(st, Config{Now: c.now, Index: x, Logger: slog.New(slog.DiscardHandler)})
	if a := s.Handle(ctx, &vcmp.LocStore{Record: vcmp.Record{Conn: web1Conn, Phys: web1Now}}, web1Now.Addr()); a.Status != vcmp.LocStored {
		t.Fatalf("store: %d", a.Status)
	}
	want := map[netip.Addr]bool{web1Conn.Local.Addr(): true, web1Now.Addr(): true}
	before := st.lists.Load()
	for range 100 {
		if h, err := x.HeldAt(ctx, c.t); err != nil || HeldList(h) != HeldList(want) {
			t.Fatalf("index: %v %v, want %v", h, err, want)
		}
	}
	if n := st.lists.Load() - before; n != 0 {
		t.Fatalf("100 answers of a started index listed the store %d times, want 0", n)
	}
	if h, err := idle.HeldAt(ctx, c.t); err != nil || HeldList(h) != HeldList(want) || st.lists.Load() != before+1 {
		t.Fatalf("index not started: %v %v (lists %d), want %v read from the store", h, err, st.lists.Load()-before, want)
	}
	cancel()
	testenv.Eventually(t, "the index to stop following the store once its context ended", 10*time.Second, func() bool { return !x.Synced() })
	before = st.lists.Load()
	if h, err := x.HeldAt(context.Background(), c.t); err != nil || HeldList(h) != HeldList(want) || st.lists.Load() != before+1 {
		t.Fatalf("index stopped: %v %v, want %v read from the store", h, err, want)
	}
}

// TestHeldIndexRelistKeepsTheServersNewerWrites: the index lists the
// store again (its watch broke) while the server stores a record: the list
// was read before the store, the store is applied to the index before the
// list is. The record must stay held: the list is older than it.
func TestHeldIndexRelistKeepsTheServersNewerWrites(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := &countingStore{Memory: store.NewMemory()}
	c := &clock{t: time.Unix(1_000_000, 0)}
	x := startIndex(t, ctx, st)
	s := New(st, Config{Now: c.now, Index: x, Logger: slog.New(slog.DiscardHandler)})
	st.afterList = func() {
		if a := s.Handle(ctx, &vcmp.LocStore{Record: vcmp.Record{Conn: web1Conn, Phys: web1Now}}, web1Now.Addr()); a.Status != vcmp.LocStored {
			t.Errorf("store: %d", a.Status)
		}
	}
	if _, err := x.relist(ctx); err != nil {
		t.Fatal(err)
	}
	h, err := x.HeldAt(ctx, c.t)
	if err != nil || !h[web1Conn.Local.Addr()] || !h[web1Now.Addr()] {
		t.Fatalf("after a list older than the store: held %v %v, want %v and %v", HeldList(h), err, web1Conn.Local.Addr(), web1Now.Addr())
	}
	sameHeld(t, "after the watch", x, st, c.t)
}
