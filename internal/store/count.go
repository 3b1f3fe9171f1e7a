package store

import (
	"context"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Counter is a Store that counts the keys under a prefix without reading
// them: etcd answers it from its in-memory index, where a List reads
// every value from its database.
type Counter interface {
	Count(ctx context.Context, prefix string) (int64, error)
}

// Count implements Counter.
func (e *Etcd) Count(ctx context.Context, prefix string) (int64, error) {
	r, err := e.c.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("etcd count %s: %w", prefix, err)
	}
	return r.Count, nil
}

// Count implements Counter.
func (m *Memory) Count(_ context.Context, prefix string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for k := range m.kv {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n, nil
}
