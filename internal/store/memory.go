package store

import (
	"context"
	"strings"
	"sync"
)

// memoryHistory is how many events a Memory keeps for watchers that start
// behind; older ones are compacted away, as etcd's auto-compaction does.
const memoryHistory = 1 << 16

// Memory is an in-process Store for tests. It keeps a bounded history of
// changes so that event watches behave as etcd's do, compaction included.
type Memory struct {
	mu       sync.Mutex
	kv       map[string][]byte
	mod      map[string]int64 // the revision each key was last written at
	rev      int64
	watchers map[chan struct{}]string
	// history holds the changes after revision compacted, in order;
	// changed is closed (and replaced) at every change, to wake event
	// watchers.
	history   []Event
	compacted int64
	changed   chan struct{}
	// Writes counts Put and Delete calls that changed the store, for tests
	// that count what a change costs.
	writes int64
}

// NewMemory returns an empty Memory store.
func NewMemory() *Memory {
	return &Memory{kv: map[string][]byte{}, mod: map[string]int64{}, watchers: map[chan struct{}]string{},
		changed: make(chan struct{})}
}

// Get implements Store.
func (m *Memory) Get(_ context.Context, key string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.kv[key]
	if !ok {
		return nil, ErrNotFound
	}
	return append([]byte(nil), v...), nil
}

// List implements Store.
func (m *Memory) List(_ context.Context, prefix string) (map[string][]byte, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string][]byte{}
	for k, v := range m.kv {
		if strings.HasPrefix(k, prefix) {
			out[k] = append([]byte(nil), v...)
		}
	}
	return out, m.rev, nil
}

// Put implements Store.
func (m *Memory) Put(ctx context.Context, key string, value []byte) error {
	if ctx.Value(riderKey{}) != nil {
		_, err := m.Txn(ctx, []Op{{Key: key, Value: value}})
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.put(key, value)
	return nil
}

func (m *Memory) put(key string, value []byte) {
	v := append([]byte{}, value...)
	m.kv[key] = v
	m.record(Event{Key: key, Value: v})
	m.mod[key] = m.rev
}

// PutIfUnchanged implements Store.
func (m *Memory) PutIfUnchanged(ctx context.Context, prefix string, rev int64, key string, value []byte) (bool, error) {
	return m.WriteIfUnchanged(ctx, prefix, rev, []Op{{Key: key, Value: value}})
}

// WriteIfUnchanged implements Store.
func (m *Memory) WriteIfUnchanged(ctx context.Context, prefix string, rev int64, ops []Op) (bool, error) {
	t, err := takeRider(ctx, len(ops))
	if err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, mod := range m.mod {
		if strings.HasPrefix(k, prefix) && mod > rev {
			t.done(false, nil)
			return false, nil
		}
	}
	m.txnLocked(t.withOps(ops...))
	t.done(true, nil)
	return true, nil
}

// Delete implements Store.
func (m *Memory) Delete(ctx context.Context, key string) error {
	if ctx.Value(riderKey{}) != nil {
		_, err := m.Txn(ctx, []Op{{Key: key, Delete: true}})
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.kv[key]; ok {
		delete(m.kv, key)
		delete(m.mod, key)
		m.record(Event{Key: key, Deleted: true})
	}
	return nil
}

// record makes a change the next revision: it is kept for event watchers
// and signalled to the others. m.mu is held.
func (m *Memory) record(e Event) { m.recordAll([]Event{e}) }

// Writes returns how many changes the store has taken.
func (m *Memory) Writes() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.writes
}

// Rev returns the store's current revision.
func (m *Memory) Rev() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rev
}

// Compact forgets the history up to and including rev: a watch from an
// older revision then ends with ErrCompacted, as etcd's does.
func (m *Memory) Compact(rev int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rev <= m.compacted {
		return
	}
	i := 0
	for i < len(m.history) && m.history[i].Rev <= rev {
		i++
	}
	m.history = append([]Event(nil), m.history[i:]...)
	m.compacted = rev
}

// Watch implements Store. Changes between rev and the call are signalled at once.
func (m *Memory) Watch(ctx context.Context, prefix string, rev int64) <-chan struct{} {
	ch := make(chan struct{}, 1)
	m.mu.Lock()
	m.watchers[ch] = prefix
	if m.rev > rev {
		ch <- struct{}{}
	}
	m.mu.Unlock()
	go func() {
		<-ctx.Done()
		m.mu.Lock()
		delete(m.watchers, ch)
		close(ch)
		m.mu.Unlock()
	}()
	return ch
}

// WatchEvents implements Store.
func (m *Memory) WatchEvents(ctx context.Context, prefix string, rev int64) <-chan Batch {
	out := make(chan Batch, 1)
	go func() {
		defer close(out)
		next := rev // the last revision sent
		for {
			m.mu.Lock()
			if next < m.compacted {
				m.mu.Unlock()
				select {
				case out <- Batch{Err: ErrCompacted}:
				case <-ctx.Done():
				}
				return
			}
			var b Batch
			// history is in revision order: skip what was sent.
			i := len(m.history)
			for i > 0 && m.history[i-1].Rev > next {
				i--
			}
			for _, e := range m.history[i:] {
				if strings.HasPrefix(e.Key, prefix) {
					b.Events = append(b.Events, e)
				}
			}
			if len(m.history) > 0 {
				next = max(next, m.history[len(m.history)-1].Rev)
			}
			wake := m.changed
			m.mu.Unlock()
			if len(b.Events) > 0 {
				select {
				case out <- b:
				case <-ctx.Done():
					return
				}
			}
			select {
			case <-wake:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// Close implements Store.
func (m *Memory) Close() error { return nil }
