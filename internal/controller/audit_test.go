package controller

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ipam"
	"github.com/onehop/onehop/internal/store"
)

// listCounting is a memory store that counts the lists of each prefix.
type listCounting struct {
	*store.Memory
	mu    sync.Mutex
	lists map[string]int
}

func (s *listCounting) List(ctx context.Context, prefix string) (map[string][]byte, int64, error) {
	s.mu.Lock()
	s.lists[prefix]++
	s.mu.Unlock()
	return s.Memory.List(ctx, prefix)
}

func (s *listCounting) listed(prefix string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lists[prefix]
}

// The trail is listed once, when the controller first appends; after
// that, every auditRelist appends it counts the keys and lists them again
// only when the count is not the one it knows (another controller
// appended): listing the whole trail on the write path stalled writes for
// a second at 10,000 entries (docs/scale-harness.md, "Revocation").
func TestAuditListsItsTrailOnlyWhenAnotherWriterChangedIt(t *testing.T) {
	s := &listCounting{Memory: store.NewMemory(), lists: map[string]int{}}
	c := New(s, discard)
	c.SetAuditKeep(5)
	ctx := t.Context()
	appendN := func(n int) {
		for i := range n {
			if err := c.audit.record(ctx, c.raw, AuditEntry{Who: "admin (socket)", Method: "POST", Path: fmt.Sprint("/v1/x/", i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	keys := func() int {
		n, err := s.Count(ctx, intent.AuditPrefix)
		if err != nil {
			t.Fatal(err)
		}
		return int(n)
	}
	appendN(2*auditRelist + 1)
	if got := s.listed(intent.AuditPrefix); got != 1 {
		t.Fatalf("the trail was listed %d times over %d appends with no other writer, want once (the first append)", got, 2*auditRelist+1)
	}
	if keys() != 5 {
		t.Fatalf("%d audit keys, want 5", keys())
	}
	// Another controller on the same store appends an entry.
	if err := s.Put(ctx, intent.AuditPrefix+fmt.Sprintf("%016x%04x", time.Now().UnixNano(), 0), []byte(`{"who":"other"}`)); err != nil {
		t.Fatal(err)
	}
	appendN(auditRelist + 1)
	if got := s.listed(intent.AuditPrefix); got != 2 {
		t.Fatalf("the trail was listed %d times in all, want a second time once another writer added a key", got)
	}
	if keys() != 5 {
		t.Fatalf("%d audit keys after another writer's entry, want 5: the relist found it and dropped it in turn", keys())
	}
}

// Both stores count a prefix's keys as List finds them (the audit trail's
// check, auditLog.check), and only that prefix's.
func TestStoresCountAPrefixAsTheyListIt(t *testing.T) {
	for name, s := range map[string]store.Store{"memory": store.NewMemory(), "etcd": embeddedStore(t, EtcdOptions{NoFsync: true})} {
		ctx := t.Context()
		for i := range 7 {
			if err := s.Put(ctx, fmt.Sprint(intent.AuditPrefix, i), []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Put(ctx, intent.AuditPrefix[:len(intent.AuditPrefix)-1]+"x", []byte("beside")); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, intent.AuditPrefix+"3"); err != nil {
			t.Fatal(err)
		}
		n, err := s.(store.Counter).Count(ctx, intent.AuditPrefix)
		kvs, _, lerr := s.List(ctx, intent.AuditPrefix)
		if err != nil || lerr != nil || n != 6 || len(kvs) != 6 {
			t.Errorf("%s: count %d (%v), list %d (%v); want 6", name, n, err, len(kvs), lerr)
		}
	}
}

// An API write's audit entry is in the transaction of the request's first
// write (a store.Rider), on both stores: it lands at that write's
// revision, and the request costs the transactions it costs with the
// trail off, not one more.
func TestAuditEntryLandsInTheTransactionOfItsWrite(t *testing.T) {
	for name, s := range map[string]store.Store{"memory": store.NewMemory(), "etcd": embeddedStore(t, EtcdOptions{NoFsync: true})} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			c := New(s, discard)
			srv := newAPIServer(t, c)
			mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
			_, from, err := s.List(ctx, intent.AuditPrefix)
			if err != nil {
				t.Fatal(err)
			}
			evs := s.WatchEvents(ctx, intent.Root, from)
			mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`, 201)
			_, to, err := s.List(ctx, intent.AuditPrefix)
			if err != nil {
				t.Fatal(err)
			}
			first, auditRev := int64(0), int64(0)
			var audits []string
			for rev := from; rev < to; {
				b, ok := <-evs
				if !ok || b.Err != nil {
					t.Fatalf("watch ended at revision %d of %d: %v", rev, to, b.Err)
				}
				for _, ev := range b.Events {
					rev = ev.Rev
					if first == 0 {
						first = ev.Rev
					}
					if strings.HasPrefix(ev.Key, intent.AuditPrefix) {
						audits = append(audits, string(ev.Value))
						auditRev = ev.Rev
					}
				}
			}
			if len(audits) != 1 || !strings.Contains(audits[0], `"status":201`) || !strings.Contains(audits[0], `"change":"{\"name\":\"web\"}"`) {
				t.Fatalf("the subnet's create wrote audit entries %q, want one, 201, naming web", audits)
			}
			if auditRev != first {
				t.Errorf("the audit entry landed at revision %d, the request's first write at %d: want one transaction", auditRev, first)
			}
		})
	}
	writes := func(keep int) int64 {
		c, s := newController()
		c.SetAuditKeep(keep)
		srv := newAPIServer(t, c)
		putHost(t, s, "h1")
		mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
		before := s.Writes()
		mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`, 201)
		mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web1","host":"h1"}`, 201)
		mustCall(t, srv, "DELETE", "/v1/farms/blue/subnets/web/vms/web1", "", 204)
		return s.Writes() - before
	}
	if on, off := writes(DefaultAuditKeep), writes(0); on != off {
		t.Errorf("three API writes took %d transactions with the audit trail, %d without: want the same", on, off)
	}
}

// failingPut is a memory store whose puts of one key fail.
type failingPut struct {
	*store.Memory
	key string
}

func (s *failingPut) Put(ctx context.Context, key string, value []byte) error {
	if key == s.key {
		return fmt.Errorf("put %s: the disk is full", key)
	}
	return s.Memory.Put(ctx, key, value)
}

// A request that fails after one of its writes landed has its entry all
// the same, with the status it was answered; one that fails before it
// wrote anything has none.
func TestAWriteThatLandsIsAuditedEvenWhenItsRequestFails(t *testing.T) {
	s := &failingPut{Memory: store.NewMemory(), key: intent.SubnetKey("blue", "web")}
	c := New(s, discard)
	srv := newAPIServer(t, c)
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/red/subnets", `{"name":"web"}`, 404)
	// The subnet's id is allocated (a write), then its record fails.
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`, 500)
	var a ipam.Allocations
	if err := store.GetJSON(t.Context(), s, intent.AllocKey, &a); err != nil || a.Subnets["blue/web"] == 0 {
		t.Fatalf("allocations %+v (%v): want blue/web's id, the write that landed", a, err)
	}
	all, err := c.Audit(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[1].Path != "/v1/farms/blue/subnets" || all[1].Status != 500 || all[1].Change != `{"name":"web"}` {
		t.Fatalf("audit %+v: want the farm's create and the failed subnet create (500), not red's 404", all)
	}
}
