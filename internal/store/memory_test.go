package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

func next(t *testing.T, ch <-chan Batch) Batch {
	t.Helper()
	select {
	case b, ok := <-ch:
		if !ok {
			t.Fatal("watch closed")
		}
		return b
	case <-time.After(5 * time.Second):
		t.Fatal("no batch within 5s")
	}
	return Batch{}
}

// A watch carries the changes under its prefix, in order, with their
// revisions and deletions; a watch from a revision the store has
// compacted away ends with ErrCompacted, as etcd's does.
func TestMemoryWatchCarriesChangesAndEndsWhenCompacted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := NewMemory()
	m.Put(ctx, "/a/1", []byte("x"))
	from := m.Rev()
	w := m.WatchEvents(ctx, "/a/", from)
	m.Put(ctx, "/b/1", []byte("other prefix"))
	m.Put(ctx, "/a/2", []byte("y"))
	m.Delete(ctx, "/a/1")
	var got []Event
	for len(got) < 2 {
		got = append(got, next(t, w).Events...)
	}
	if len(got) != 2 || got[0].Key != "/a/2" || string(got[0].Value) != "y" || got[0].Rev != from+2 ||
		got[1].Key != "/a/1" || !got[1].Deleted || got[1].Rev != from+3 {
		t.Fatalf("events %+v", got)
	}
	m.Compact(m.Rev())
	old := m.WatchEvents(ctx, "/a/", from)
	if b := next(t, old); !errors.Is(b.Err, ErrCompacted) {
		t.Fatalf("a watch from compacted revision %d: %+v, want ErrCompacted", from, b)
	}
	// A watch that is up to date is not broken by compaction.
	m.Put(ctx, "/a/3", []byte("z"))
	if b := next(t, w); b.Err != nil || len(b.Events) != 1 || b.Events[0].Key != "/a/3" {
		t.Fatalf("the live watch after compaction: %+v", b)
	}
}
