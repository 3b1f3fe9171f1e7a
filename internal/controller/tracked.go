package controller

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// tracked is the store as the controller's own code sees it: every write
// of intent is applied to the model and compiled there and then into the
// desired keys it changes, a bounded number whatever the cloud's size. So
// the code that changes intent (the API, the topology) needs to know
// nothing of the desired state.
type tracked struct {
	store.Store
	c *Controller
}

func isIntent(key string) bool { return strings.HasPrefix(key, intent.Prefix) }

// Put implements store.Store.
func (t *tracked) Put(ctx context.Context, key string, value []byte) error {
	if err := t.Store.Put(ctx, key, value); err != nil {
		if isIntent(key) {
			t.c.invalidate() // it may have been written all the same
		}
		return err
	}
	if isIntent(key) {
		t.c.changed(ctx, key, value, false)
	}
	return nil
}

// Get implements store.Store. Hosts are the one intent an operator may
// write behind the controller (api_hosts.go): a host read here that the
// model does not know, or knows otherwise, is taken in there and then, so
// a VM placed on it gets its desired key at once.
func (t *tracked) Get(ctx context.Context, key string) ([]byte, error) {
	v, err := t.Store.Get(ctx, key)
	if !strings.HasPrefix(key, intent.HostsPrefix) || (err != nil && !errors.Is(err, store.ErrNotFound)) {
		return v, err
	}
	name := strings.TrimPrefix(key, intent.HostsPrefix)
	m := &t.c.model
	m.mu.Lock()
	stale := false
	if m.loaded {
		h, known := m.hosts[name]
		switch {
		case err != nil:
			stale = known
		case !known:
			stale = true
		default:
			stale = !bytes.Equal(mustJSON(h), v)
		}
	}
	m.mu.Unlock()
	if stale {
		t.c.changed(ctx, key, v, err != nil)
	}
	return v, err
}

// PutIfUnchanged implements store.Store.
func (t *tracked) PutIfUnchanged(ctx context.Context, prefix string, rev int64, key string, value []byte) (bool, error) {
	ok, err := t.Store.PutIfUnchanged(ctx, prefix, rev, key, value)
	if err != nil {
		if isIntent(key) {
			t.c.invalidate()
		}
		return ok, err
	}
	if ok && isIntent(key) {
		t.c.changed(ctx, key, value, false)
	}
	return ok, nil
}

// WriteIfUnchanged implements store.Store.
func (t *tracked) WriteIfUnchanged(ctx context.Context, prefix string, rev int64, ops []store.Op) (bool, error) {
	ok, err := t.Store.WriteIfUnchanged(ctx, prefix, rev, ops)
	intentOp := slices.ContainsFunc(ops, func(o store.Op) bool { return isIntent(o.Key) })
	if err != nil {
		if intentOp {
			t.c.invalidate()
		}
		return ok, err
	}
	if ok {
		for _, o := range ops {
			if isIntent(o.Key) {
				t.c.changed(ctx, o.Key, o.Value, o.Delete)
			}
		}
	}
	return ok, nil
}

// Delete implements store.Store.
func (t *tracked) Delete(ctx context.Context, key string) error {
	if err := t.Store.Delete(ctx, key); err != nil {
		if isIntent(key) {
			t.c.invalidate()
		}
		return err
	}
	if isIntent(key) {
		t.c.changed(ctx, key, nil, true)
	}
	return nil
}

// changed compiles one write of intent into the desired keys it changes. A
// failure to write them does not fail the intent's write (it stands): the
// model is dropped and Run compiles in full until it succeeds.
func (c *Controller) changed(ctx context.Context, key string, value []byte, deleted bool) {
	m := &c.model
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.loaded {
		// The load reads this write too.
		if _, err := c.compileAllLocked(ctx); err != nil {
			c.log.Error("compile desired state; Run retries", "after", key, "err", err)
			c.invalidateLocked()
		}
		return
	}
	start := time.Now()
	err := m.apply(key, value, deleted)
	if err == nil {
		var writes int
		writes, err = m.compile(ctx, c.raw)
		if err == nil {
			c.log.Debug("desired state compiled", "after", key, "keys_written", writes, "took", time.Since(start).Round(time.Microsecond))
			return
		}
	}
	c.log.Error("compile desired state; Run compiles in full", "after", key, "err", err)
	c.invalidateLocked()
}

// invalidate drops the model: the store may hold what it does not know.
func (c *Controller) invalidate() {
	c.model.mu.Lock()
	defer c.model.mu.Unlock()
	c.invalidateLocked()
}

func (c *Controller) invalidateLocked() {
	c.model.loaded = false
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// view runs f on the loaded model, loading it (and compiling in full)
// first if needed.
func (c *Controller) view(ctx context.Context, f func(m *model) error) error {
	m := &c.model
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.loaded {
		if _, err := c.compileAllLocked(ctx); err != nil {
			return err
		}
	}
	return f(m)
}
