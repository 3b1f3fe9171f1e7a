package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/onehop/onehop/internal/store"
)

// ReadyTimeout bounds the store read of a readiness check: a store that
// takes longer is as good as unreachable to the API's callers.
const ReadyTimeout = 2 * time.Second

// readyKey is read, never written: a missing key is an answer too.
const readyKey = "/onehop/readyz"

// StoreReachable says why the controller's store does not answer (its
// /readyz), nil when a read came back within ReadyTimeout.
func (c *Controller) StoreReachable(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	if _, err := c.raw.Get(ctx, readyKey); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("store unreachable: %w", err)
	}
	return nil
}

// DefaultMetricsAddr is the controller's operations port unless told
// otherwise: the loopback, beside the agent's (127.0.0.1:9100) on a host
// that runs both.
const DefaultMetricsAddr = "127.0.0.1:9101"
