// Package store is onehop's only state: etcd (embedded or external) behind a
// small interface, plus an in-memory implementation for tests of the
// controller and agent logic.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// ErrNotFound is returned by Get for a missing key.
var ErrNotFound = errors.New("key not found")

// ErrCompacted ends a watch that asked for revisions the store no longer
// keeps: the watcher must relist.
var ErrCompacted = errors.New("revision compacted")

// Event is one change of one key.
type Event struct {
	Key     string
	Value   []byte // nil for a deletion
	Deleted bool
	Rev     int64 // the revision the change was made at
}

// Batch is what one watch response carries: changes in revision order, or
// the error that ends the watch (the channel closes after it).
type Batch struct {
	Events []Event
	Err    error
}

// Store is the subset of etcd onehop uses.
type Store interface {
	// Get returns the value under key or ErrNotFound.
	Get(ctx context.Context, key string) ([]byte, error)
	// List returns every key under prefix and the store revision it was read at.
	List(ctx context.Context, prefix string) (map[string][]byte, int64, error)
	// Put writes key.
	Put(ctx context.Context, key string, value []byte) error
	// PutIfUnchanged writes key only if no key under prefix was created or
	// changed after revision rev (the revision a List returned), and
	// reports whether it wrote: the compare-and-swap that keeps two
	// writers who read the same state from both taking what they saw free.
	// A key deleted after rev does not stop it (deleting frees, never
	// takes).
	PutIfUnchanged(ctx context.Context, prefix string, rev int64, key string, value []byte) (bool, error)
	// WriteIfUnchanged is PutIfUnchanged for several writes: ops land
	// together, in one transaction, or none does. A record and the guard
	// key that orders its kind's writers (a host's lease space) are
	// written so.
	WriteIfUnchanged(ctx context.Context, prefix string, rev int64, ops []Op) (bool, error)
	// Delete removes key; a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// Watch sends a signal after any change under prefix made after revision
	// rev. The channel closes when ctx ends or the watch breaks; callers
	// re-List and watch again (level-triggered, so a lost event loses nothing).
	Watch(ctx context.Context, prefix string, rev int64) <-chan struct{}
	// WatchEvents streams every change under prefix made after revision
	// rev, in revision order: what changed, not a signal to relist. The
	// channel closes when ctx ends or the watch breaks; a broken watch
	// sends a Batch with Err first where it can (ErrCompacted when rev is
	// older than the store keeps). The caller then relists and watches
	// from the revision of its list.
	WatchEvents(ctx context.Context, prefix string, rev int64) <-chan Batch
	Close() error
}

// GetJSON reads key into v.
func GetJSON(ctx context.Context, s Store, key string, v any) error {
	b, err := s.Get(ctx, key)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s: %w", key, err)
	}
	return nil
}

// PutJSON writes v as JSON under key.
func PutJSON(ctx context.Context, s Store, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", key, err)
	}
	return s.Put(ctx, key, b)
}

// ListJSON decodes every value under prefix as a T.
func ListJSON[T any](ctx context.Context, s Store, prefix string) ([]T, int64, error) {
	kvs, rev, err := s.List(ctx, prefix)
	if err != nil {
		return nil, 0, err
	}
	out := make([]T, 0, len(kvs))
	for k, b := range kvs {
		var v T
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, 0, fmt.Errorf("decode %s: %w", k, err)
		}
		out = append(out, v)
	}
	return out, rev, nil
}
