package store

import (
	"context"
	"strings"
	"sync"
)

// Memory is an in-process Store for tests.
type Memory struct {
	mu       sync.Mutex
	kv       map[string][]byte
	mod      map[string]int64 // the revision each key was last written at
	rev      int64
	watchers map[chan struct{}]string
}

// NewMemory returns an empty Memory store.
func NewMemory() *Memory {
	return &Memory{kv: map[string][]byte{}, mod: map[string]int64{}, watchers: map[chan struct{}]string{}}
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
func (m *Memory) Put(_ context.Context, key string, value []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.put(key, value)
	return nil
}

func (m *Memory) put(key string, value []byte) {
	m.kv[key] = append([]byte(nil), value...)
	m.changed(key)
	m.mod[key] = m.rev
}

// PutIfUnchanged implements Store.
func (m *Memory) PutIfUnchanged(_ context.Context, prefix string, rev int64, key string, value []byte) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, mod := range m.mod {
		if strings.HasPrefix(k, prefix) && mod > rev {
			return false, nil
		}
	}
	m.put(key, value)
	return true, nil
}

// Delete implements Store.
func (m *Memory) Delete(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.kv[key]; ok {
		delete(m.kv, key)
		delete(m.mod, key)
		m.changed(key)
	}
	return nil
}

func (m *Memory) changed(key string) {
	m.rev++
	for ch, prefix := range m.watchers {
		if strings.HasPrefix(key, prefix) {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
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

// Close implements Store.
func (m *Memory) Close() error { return nil }
