package store

import (
	"context"
	"crypto/tls"
	"fmt"
	"time"

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
	if _, err := e.c.Put(ctx, key, string(value)); err != nil {
		return fmt.Errorf("etcd put %s: %w", key, err)
	}
	return nil
}

// PutIfUnchanged implements Store: one etcd transaction comparing the
// mod revision of every key under prefix (a range compare) with rev.
func (e *Etcd) PutIfUnchanged(ctx context.Context, prefix string, rev int64, key string, value []byte) (bool, error) {
	r, err := e.c.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(prefix), "<", rev+1).WithPrefix()).
		Then(clientv3.OpPut(key, string(value))).
		Commit()
	if err != nil {
		return false, fmt.Errorf("etcd put %s if %s unchanged since %d: %w", key, prefix, rev, err)
	}
	return r.Succeeded, nil
}

// Delete implements Store.
func (e *Etcd) Delete(ctx context.Context, key string) error {
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

// Close implements Store.
func (e *Etcd) Close() error { return e.c.Close() }
