package controller

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/onehop/onehop/internal/store"
)

// decideRetries bounds how often a write that lost a race to another
// controller is decided again on what that one wrote.
const decideRetries = 8

// decideAndWrite is an optimistic read-decide-write on everything under
// prefix: decide sees the values there as of one read and says which key
// to write with what (or refuses, which ends it); the write lands only if
// nothing under prefix was written since that read (another controller on
// the same etcd), else it decides again on what is there now. So two
// writers can never both take one slot, range or id. what names the thing
// written in the log and the final error.
func decideAndWrite[T any](ctx context.Context, c *Controller, prefix, what string, decide func(all []T) (key string, v T, err error)) (T, error) {
	var zero T
	for attempt := 0; attempt < decideRetries; attempt++ {
		all, rev, err := store.ListJSON[T](ctx, c.store, prefix)
		if err != nil {
			return zero, err
		}
		key, v, err := decide(all)
		if err != nil {
			return zero, err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return v, fmt.Errorf("encode %s: %w", what, err)
		}
		ok, err := c.store.PutIfUnchanged(ctx, prefix, rev, key, b)
		if err != nil || ok {
			return v, err
		}
		c.log.Info("write raced another writer; deciding again", "what", what, "attempt", attempt+1)
	}
	return zero, fmt.Errorf("%s: what it is decided on kept changing under %d attempts to write it", what, decideRetries)
}
