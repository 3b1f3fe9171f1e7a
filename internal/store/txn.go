package store

import (
	"context"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxTxnOps is how many operations one etcd transaction may carry by
// default (etcd's --max-txn-ops): a writer that batches keeps its
// transactions this small.
const MaxTxnOps = 128

// Op is one write of a transaction: Value put under Key, or Key deleted.
type Op struct {
	Key    string
	Value  []byte
	Delete bool
}

// opKeys names the keys ops write, for an error.
func opKeys(ops []Op) string {
	keys := make([]string, len(ops))
	for i, o := range ops {
		keys[i] = o.Key
	}
	return strings.Join(keys, ", ")
}

// Txner is a Store that writes several keys in one transaction, all at
// one revision, which it returns. Ops name each key at most once (etcd
// refuses a transaction that puts one key twice).
type Txner interface {
	Txn(ctx context.Context, ops []Op) (int64, error)
}

// Txn implements Txner: one etcd transaction, unconditional, with ctx's
// rider if it has one still to carry.
func (e *Etcd) Txn(ctx context.Context, ops []Op) (int64, error) {
	t, err := takeRider(ctx, len(ops))
	if err != nil {
		return 0, fmt.Errorf("etcd transaction of %d writes: %w", len(ops), err)
	}
	rev, err := e.txn(ctx, t.withOps(ops...))
	t.done(true, err)
	return rev, err
}

func (e *Etcd) txn(ctx context.Context, ops []Op) (int64, error) {
	r, err := e.c.Txn(ctx).Then(etcdOps(ops)...).Commit()
	if err != nil {
		return 0, fmt.Errorf("etcd transaction of %d writes: %w", len(ops), err)
	}
	return r.Header.Revision, nil
}

func etcdOps(ops []Op) []clientv3.Op {
	eops := make([]clientv3.Op, len(ops))
	for i, o := range ops {
		if o.Delete {
			eops[i] = clientv3.OpDelete(o.Key)
		} else {
			eops[i] = clientv3.OpPut(o.Key, string(o.Value))
		}
	}
	return eops
}

// Txn implements Txner: the ops take one revision, as etcd's do, and count
// as one write, with ctx's rider if it has one still to carry. A key named
// twice is refused, as etcd refuses it.
func (m *Memory) Txn(ctx context.Context, ops []Op) (int64, error) {
	t, err := takeRider(ctx, len(ops))
	if err != nil {
		return 0, err
	}
	ops = t.withOps(ops...)
	seen := make(map[string]bool, len(ops))
	for _, o := range ops {
		if seen[o.Key] {
			err := fmt.Errorf("memory transaction: key %s named twice", o.Key)
			t.done(false, err)
			return 0, err
		}
		seen[o.Key] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	rev := m.txnLocked(ops)
	t.done(true, nil)
	return rev, nil
}

// txnLocked applies ops at one revision and returns the store's revision.
// m.mu is held.
func (m *Memory) txnLocked(ops []Op) int64 {
	var evs []Event
	for _, o := range ops {
		if o.Delete {
			if _, ok := m.kv[o.Key]; ok {
				delete(m.kv, o.Key)
				delete(m.mod, o.Key)
				evs = append(evs, Event{Key: o.Key, Deleted: true})
			}
			continue
		}
		v := append([]byte{}, o.Value...)
		m.kv[o.Key] = v
		m.mod[o.Key] = m.rev + 1
		evs = append(evs, Event{Key: o.Key, Value: v})
	}
	if len(evs) > 0 {
		m.recordAll(evs)
	}
	return m.rev
}

// recordAll is record for the changes of one transaction: one revision,
// one write, one wake-up. m.mu is held.
func (m *Memory) recordAll(evs []Event) {
	m.rev++
	m.writes++
	for _, e := range evs {
		e.Rev = m.rev
		m.history = append(m.history, e)
	}
	if len(m.history) > memoryHistory {
		drop := len(m.history) - memoryHistory/2
		m.compacted = m.history[drop-1].Rev
		m.history = append([]Event(nil), m.history[drop:]...)
	}
	close(m.changed)
	m.changed = make(chan struct{})
	for ch, prefix := range m.watchers {
		for _, e := range evs {
			if strings.HasPrefix(e.Key, prefix) {
				select {
				case ch <- struct{}{}:
				default:
				}
				break
			}
		}
	}
}
