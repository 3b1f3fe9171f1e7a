package store

import (
	"context"
	"slices"
	"sync"
)

// Rider is writes that go into the transaction of the first write made
// under a context (WithRider), so that they land with it or not at all:
// the controller's audit entry of an API request rides on the request's
// first write, and costs no transaction of its own. Put, Delete,
// PutIfUnchanged and Txn of both stores carry it; a write that fails, or
// a PutIfUnchanged that does not write, leaves it for the next.
type Rider struct {
	mu sync.Mutex
	// ops returns the rider's writes for a transaction with room for
	// room more, or none if they do not fit (the next write takes them).
	ops func(room int) ([]Op, error)
	// settled is told whether the transaction that took ops committed
	// (written), or the error that may have left it unknown.
	settled func(ops []Op, written bool, err error)
	carried bool
	closed  bool
}

// NewRider returns a rider whose writes ops makes at the first write that
// takes them, and which tells settled how that write ended.
func NewRider(ops func(room int) ([]Op, error), settled func(ops []Op, written bool, err error)) *Rider {
	return &Rider{ops: ops, settled: settled}
}

type riderKey struct{}

// WithRider returns ctx whose first write carries r.
func WithRider(ctx context.Context, r *Rider) context.Context {
	return context.WithValue(ctx, riderKey{}, r)
}

// Close ends r: no write takes it from now on. It reports whether a
// committed transaction carried it.
func (r *Rider) Close() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	return r.carried
}

// ride is a rider taken by one write: its ops go into the write's
// transaction, and done says how it ended. A nil ride (no rider, or one
// already carried) has no ops and done does nothing.
type ride struct {
	r   *Rider
	ops []Op
}

// takeRider takes ctx's rider for a write of n ops, holding it (a second
// write of the same request waits) until done.
func takeRider(ctx context.Context, n int) (*ride, error) {
	r, _ := ctx.Value(riderKey{}).(*Rider)
	if r == nil {
		return nil, nil
	}
	r.mu.Lock()
	if r.carried || r.closed {
		r.mu.Unlock()
		return nil, nil
	}
	ops, err := r.ops(MaxTxnOps - n)
	if err != nil || len(ops) == 0 {
		r.mu.Unlock()
		return nil, err
	}
	return &ride{r: r, ops: ops}, nil
}

// withOps is ops followed by the ride's.
func (t *ride) withOps(ops ...Op) []Op {
	if t == nil {
		return ops
	}
	return append(slices.Clip(ops), t.ops...)
}

// done settles the ride: written if its transaction committed.
func (t *ride) done(written bool, err error) {
	if t == nil {
		return
	}
	t.r.carried = written && err == nil
	t.r.settled(t.ops, t.r.carried, err)
	t.r.mu.Unlock()
}
