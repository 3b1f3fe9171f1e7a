package store

import (
	"context"
	"crypto/tls"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Etcd is a Store backed by an etcd cluster.
type Etcd struct {
	c *clientv3.Client
}

// DialEtcd connects to endpoints over plain TCP (http://host:port) or a
// local unix socket (unix:///path).
func DialEtcd(endpoints []string) (*Etcd, error) {
	return DialEtcdTLS(endpoints, nil)
}

// DialEtcdTLS connects to endpoints (https://host:port) with tc: the CA
// that signed the servers' certificates and this client's own certificate.
// A nil tc dials plain, as DialEtcd.
func DialEtcdTLS(endpoints []string, tc *tls.Config) (*Etcd, error) {
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		TLS:         tc,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("connect to etcd %v: %w", endpoints, err)
	}
	return &Etcd{c: c}, nil
}

// Get implements Store.
func (e *Etcd) Get(ctx context.Context, key string) ([]byte, error) {
	r, err := e.c.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("etcd get %s: %w", key, err)
	}
	if len(r.Kvs) == 0 {
		return nil, ErrNotFound
	}
	return r.Kvs[0].Value, nil
}

// List implements Store.
func (e *Etcd) List(ctx context.Context, prefix string) (map[string][]byte, int64, error) {
	r, err := e.c.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("etcd list %s: %w", prefix, err)
	}
	out := make(map[string][]byte, len(r.Kvs))
	for _, kv := range r.Kvs {
		out[string(kv.Key)] = kv.Value
	}
	return out, r.Header.Revision, nil
}

// Put implements Store.
func (e *Etcd) Put(ctx context.Context, key string, value []byte) error {
	if ctx.Value(riderKey{}) != nil {
		return e.withRider(ctx, "put "+key, Op{Key: key, Value: value})
	}
	if _, err := e.c.Put(ctx, key, string(value)); err != nil {
		return fmt.Errorf("etcd put %s: %w", key, err)
	}
	return nil
}

// withRider writes op in one transaction with ctx's rider, if it has one
// still to carry.
func (e *Etcd) withRider(ctx context.Context, what string, op Op) error {
	t, err := takeRider(ctx, 1)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", what, err)
	}
	_, err = e.txn(ctx, t.withOps(op))
	t.done(true, err)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", what, err)
	}
	return nil
}

// PutIfUnchanged implements Store: one etcd transaction comparing the
// mod revision of every key under prefix (a range compare) with rev.
func (e *Etcd) PutIfUnchanged(ctx context.Context, prefix string, rev int64, key string, value []byte) (bool, error) {
	return e.WriteIfUnchanged(ctx, prefix, rev, []Op{{Key: key, Value: value}})
}

// WriteIfUnchanged implements Store: PutIfUnchanged's one transaction,
// with every op of ops in it.
func (e *Etcd) WriteIfUnchanged(ctx context.Context, prefix string, rev int64, ops []Op) (bool, error) {
	what := fmt.Sprintf("etcd write %s if %s unchanged since %d", opKeys(ops), prefix, rev)
	t, err := takeRider(ctx, len(ops))
	if err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	r, err := e.c.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(prefix), "<", rev+1).WithPrefix()).
		Then(etcdOps(t.withOps(ops...))...).
		Commit()
	t.done(err == nil && r.Succeeded, err)
	if err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	return r.Succeeded, nil
}

// Delete implements Store.
func (e *Etcd) Delete(ctx context.Context, key string) error {
	if ctx.Value(riderKey{}) != nil {
		return e.withRider(ctx, "delete "+key, Op{Key: key, Delete: true})
	}
	if _, err := e.c.Delete(ctx, key); err != nil {
		return fmt.Errorf("etcd delete %s: %w", key, err)
	}
	return nil
}

// Watch implements Store.
func (e *Etcd) Watch(ctx context.Context, prefix string, rev int64) <-chan struct{} {
	out := make(chan struct{}, 1)
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	wch := e.c.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	go func() {
		defer close(out)
		defer cancel()
		for resp := range wch {
			if resp.Err() != nil {
				return
			}
			select {
			case out <- struct{}{}:
			default: // a signal is already pending; the reader re-lists anyway
			}
		}
	}()
	return out
}

// WatchEvents implements Store.
func (e *Etcd) WatchEvents(ctx context.Context, prefix string, rev int64) <-chan Batch {
	out := make(chan Batch, 1)
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	wch := e.c.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	go func() {
		defer close(out)
		defer cancel()
		for resp := range wch {
			var b Batch
			switch {
			case resp.CompactRevision != 0:
				b.Err = fmt.Errorf("watch %s from %d: %w (now at %d)", prefix, rev+1, ErrCompacted, resp.CompactRevision)
			case resp.Err() != nil:
				b.Err = fmt.Errorf("watch %s: %w", prefix, resp.Err())
			}
			for _, ev := range resp.Events {
				b.Events = append(b.Events, Event{Key: string(ev.Kv.Key), Value: ev.Kv.Value,
					Deleted: ev.Type == clientv3.EventTypeDelete, Rev: ev.Kv.ModRevision})
			}
			if len(b.Events) == 0 && b.Err == nil {
				continue // a progress notification
			}
			select {
			case out <- b:
			case <-ctx.Done():
				return
			}
			if b.Err != nil {
				return
			}
		}
	}()
	return out
}

// Health is what the cluster says of its database: how big it is, how much
// of it holds live data, the quota it refuses writes beyond, and its alarms.
type Health struct {
	Endpoint string `json:"endpoint"`
	// DBSize is the database file's size; DBSizeInUse the part holding
	// data (the rest is free pages a defragmentation gives back).
	DBSize      int64 `json:"dbSize"`
	DBSizeInUse int64 `json:"dbSizeInUse"`
	// Quota is the size beyond which the member raises NOSPACE and
	// refuses every write.
	Quota    int64  `json:"quota"`
	Revision int64  `json:"revision"`
	Version  string `json:"version"`
	// Alarms are the cluster's raised alarms (NOSPACE, CORRUPT), by
	// member.
	Alarms []string `json:"alarms,omitempty"`
}

// Health asks the first endpoint that answers for its database's figures,
// and the cluster for its alarms.
func (e *Etcd) Health(ctx context.Context) (Health, error) {
	var last error
	for _, ep := range e.c.Endpoints() {
		st, err := e.c.Status(ctx, ep)
		if err != nil {
			last = fmt.Errorf("etcd status of %s: %w", ep, err)
			continue
		}
		h := Health{Endpoint: ep, DBSize: st.DbSize, DBSizeInUse: st.DbSizeInUse, Quota: st.DbSizeQuota,
			Revision: st.Header.Revision, Version: st.Version}
		al, err := e.c.AlarmList(ctx)
		if err != nil {
			return h, fmt.Errorf("etcd alarms: %w", err)
		}
		for _, a := range al.Alarms {
			h.Alarms = append(h.Alarms, fmt.Sprintf("%s (member %x)", a.Alarm, a.MemberID))
		}
		return h, nil
	}
	return Health{}, last
}

// Compact discards every revision before rev (the current values stay):
// watches from older revisions end with ErrCompacted.
func (e *Etcd) Compact(ctx context.Context, rev int64) error {
	if _, err := e.c.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return fmt.Errorf("etcd compact to %d: %w", rev, err)
	}
	return nil
}

// Defragment gives every member's free pages back to the file system. A
// member answers nothing while it defragments, one member at a time.
func (e *Etcd) Defragment(ctx context.Context) error {
	for _, ep := range e.c.Endpoints() {
		if _, err := e.c.Defragment(ctx, ep); err != nil {
			return fmt.Errorf("etcd defragment %s: %w", ep, err)
		}
	}
	return nil
}

// DisarmNoSpace clears raised NOSPACE alarms, once compaction and
// defragmentation have made room: etcd never clears one itself.
func (e *Etcd) DisarmNoSpace(ctx context.Context) error {
	al, err := e.c.AlarmList(ctx)
	if err != nil {
		return fmt.Errorf("etcd alarms: %w", err)
	}
	for _, a := range al.Alarms {
		if a.Alarm != etcdserverpb.AlarmType_NOSPACE {
			continue
		}
		if _, err := e.c.AlarmDisarm(ctx, (*clientv3.AlarmMember)(a)); err != nil {
			return fmt.Errorf("etcd disarm NOSPACE of member %x: %w", a.MemberID, err)
		}
	}
	return nil
}

// Close implements Store.
func (e *Etcd) Close() error { return e.c.Close() }
