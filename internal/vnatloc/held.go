package vnatloc

import (
	"container/heap"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/ratelog"
	"github.com/onehop/onehop/internal/store"
)

// HeldIndex is Held kept up to date instead of recomputed: the addresses
// live records of moved ends hold, each with the number of records naming
// it, fed by a watch of Prefix in the store. Asking it costs the number of
// held addresses, not the number of records (Held lists and decodes every
// record on every VM allocation).
//
// It follows the store, not one server: records written by any process
// (another controller sharing the etcd) reach it through the watch. A
// Service given the index (Config.Index) also applies its own writes to it
// the moment they are committed, so an allocation that starts after a
// store was answered sees the record, whatever the watch's lag. Until the
// first list, and whenever the watch breaks until it is listed again, the
// index does not answer from memory: HeldAt then reads the store (Held),
// so a gap in the watch never hides a record.
type HeldIndex struct {
	store store.Store
	log   *slog.Logger
	rlog  *ratelog.Logger

	mu     sync.Mutex
	synced bool               // the index follows the store: answer from memory
	seen   int64              // the latest revision the watch or a list brought
	recs   map[string]heldRec // by store key; only records that hold addresses
	addrs  map[netip.Addr]int // address → live holding records naming it
	exp    expiries           // every holding record's expiry (stale entries skipped)
	// snap is the held set HeldAt last answered, shared with its callers
	// and never changed: a new one is made when an address joins or
	// leaves addrs (a refresh changes neither), so HeldAt usually costs
	// nothing of the set's size.
	snap map[netip.Addr]bool
	// ahead holds, by key, the revision of a write of the local server
	// applied before the watch brought it: the watch's older changes of
	// the key are stale and skipped.
	ahead map[string]int64
}

type heldRec struct {
	virt, phys netip.Addr
	expires    time.Time
	rev        int64 // the store revision the record was written at; 0 unknown
}

// NewHeldIndex is an index over s; Start fills it and keeps it filled.
func NewHeldIndex(s store.Store, log *slog.Logger) *HeldIndex {
	if log == nil {
		log = slog.Default()
	}
	return &HeldIndex{store: s, log: log, rlog: ratelog.New(log, 1, time.Second, time.Now),
		recs: map[string]heldRec{}, addrs: map[netip.Addr]int{}, ahead: map[string]int64{}}
}

// Start lists the records (so an index started before a controller
// allocates anything knows every live record, a restart included) and
// then follows the store until ctx ends.
func (x *HeldIndex) Start(ctx context.Context) error {
	rev, err := x.relist(ctx)
	if err != nil {
		return err
	}
	go x.follow(ctx, rev)
	return nil
}

// relistEvery is how long the index waits before listing again after its
// watch broke or a list failed; HeldAt reads the store meanwhile.
const relistEvery = time.Second

func (x *HeldIndex) follow(ctx context.Context, rev int64) {
	for {
		for b := range x.store.WatchEvents(ctx, Prefix, rev) {
			if b.Err != nil {
				x.rlog.Warn("watch", "vnat locations: held-address watch broke, relisting", "err", b.Err)
				break
			}
			rev = b.Events[len(b.Events)-1].Rev
			x.apply(b.Events, rev)
		}
		x.mu.Lock()
		x.synced = false
		x.mu.Unlock()
		for {
			if ctx.Err() != nil {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(relistEvery):
			}
			r, err := x.relist(ctx)
			if err == nil {
				rev = r
				break
			}
			if ctx.Err() == nil {
				x.rlog.Warn("list", "vnat locations: held-address list", "err", err)
			}
		}
	}
}

// relist replaces the index with the store's records. A key the local
// server wrote after the list's revision keeps what the server wrote: it
// is newer than the list, and the watch from the list's revision brings
// whatever follows.
func (x *HeldIndex) relist(ctx context.Context) (int64, error) {
	kvs, rev, err := x.store.List(ctx, Prefix)
	if err != nil {
		return 0, fmt.Errorf("vnat locations: list held addresses: %w", err)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.recs
	x.recs, x.addrs, x.exp, x.snap = map[string]heldRec{}, map[netip.Addr]int{}, nil, nil
	for k, b := range kvs {
		if x.ahead[k] <= rev {
			x.set(k, b, rev)
		}
	}
	for k, a := range x.ahead {
		if a <= rev {
			delete(x.ahead, k)
		} else if o, ok := old[k]; ok {
			x.remove(k)
			x.add(k, o)
		}
	}
	// A record newer than the list stays: the server's own write that the
	// watch confirmed (and so no longer ahead) while the list was read.
	for k, o := range old {
		if cur, kept := x.recs[k]; o.rev > rev && (!kept || cur.rev < o.rev) {
			x.remove(k)
			x.add(k, o)
		}
	}
	x.synced = true
	x.seen = max(x.seen, rev)
	return rev, nil
}

// apply takes changes from the watch.
func (x *HeldIndex) apply(evs []store.Event, rev int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, e := range evs {
		if e.Rev <= x.ahead[e.Key] {
			continue // the server's own write, or older than it
		}
		x.change(e)
	}
	x.seen = max(x.seen, rev)
	for k, a := range x.ahead {
		if a <= x.seen {
			delete(x.ahead, k)
		}
	}
}

// committed takes the server's own writes at rev (0: unknown), at once,
// unless the watch already brought them (and what followed).
func (x *HeldIndex) committed(ops []store.Op, rev int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if rev != 0 && rev <= x.seen {
		return
	}
	for _, o := range ops {
		x.change(store.Event{Key: o.Key, Value: o.Value, Deleted: o.Delete, Rev: rev})
		if rev != 0 {
			x.ahead[o.Key] = rev
		}
	}
}

// change applies one change of one key. A change older than the record
// the index holds for the key is skipped (apply also skips the watch's
// changes older than a write of the server applied ahead of it): a stale
// change must not withdraw a newer record.
func (x *HeldIndex) change(e store.Event) {
	if cur, ok := x.recs[e.Key]; ok && e.Rev != 0 && cur.rev >= e.Rev {
		return
	}
	if e.Deleted {
		x.remove(e.Key)
		return
	}
	x.set(e.Key, e.Value, e.Rev)
}

// set makes the record under key what b says: held if it is readable, the
// server's key for it and its end moved; otherwise it holds nothing, as in
// Held. Expired ones are left to expire (HeldAt drops them).
func (x *HeldIndex) set(key string, b []byte, rev int64) {
	x.remove(key)
	t, e, err := parse(b)
	if err != nil || Key(t) != key || t.Local.Addr() == e.phys.Addr() {
		return
	}
	x.add(key, heldRec{virt: t.Local.Addr(), phys: e.phys.Addr(), expires: e.expires, rev: rev})
}

func (x *HeldIndex) add(key string, r heldRec) {
	x.recs[key] = r
	for _, a := range []netip.Addr{r.virt, r.phys} {
		if x.addrs[a]++; x.addrs[a] == 1 {
			x.snap = nil
		}
	}
	heap.Push(&x.exp, expiry{at: r.expires, key: key, rev: r.rev})
}

func (x *HeldIndex) remove(key string) {
	r, ok := x.recs[key]
	if !ok {
		return
	}
	delete(x.recs, key)
	for _, a := range []netip.Addr{r.virt, r.phys} {
		if x.addrs[a]--; x.addrs[a] <= 0 {
			delete(x.addrs, a)
			x.snap = nil
		}
	}
}

// HeldAt is Held(ctx, store, now) from the index: the addresses live
// records of moved ends name. Records expired at now leave the index. When
// the index does not follow the store (not started, or its watch broke and
// it has not listed again), it is Held itself. The map is shared until the
// held set changes: callers only read it.
func (x *HeldIndex) HeldAt(ctx context.Context, now time.Time) (map[netip.Addr]bool, error) {
	x.mu.Lock()
	if !x.synced {
		x.mu.Unlock()
		return Held(ctx, x.store, now)
	}
	defer x.mu.Unlock()
	for len(x.exp) > 0 && !now.Before(x.exp[0].at) {
		ex := heap.Pop(&x.exp).(expiry)
		if r, ok := x.recs[ex.key]; ok && r.rev == ex.rev && r.expires.Equal(ex.at) {
			x.remove(ex.key)
		}
	}
	if x.snap == nil {
		x.snap = make(map[netip.Addr]bool, len(x.addrs))
		for a := range x.addrs {
			x.snap[a] = true
		}
	}
	return x.snap, nil
}

// Synced says whether HeldAt answers from memory.
func (x *HeldIndex) Synced() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.synced
}

// expiry is one record's expiry in the heap; a record stored again pushes
// a new one, and the old one is skipped when popped (rev and time differ).
type expiry struct {
	at  time.Time
	key string
	rev int64
}

type expiries []expiry

func (h expiries) Len() int           { return len(h) }
func (h expiries) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h expiries) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiries) Push(v any)        { *h = append(*h, v.(expiry)) }
func (h *expiries) Pop() any {
	old := *h
	v := old[len(old)-1]
	*h = old[:len(old)-1]
	return v
}
