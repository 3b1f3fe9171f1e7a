package controller

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
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
