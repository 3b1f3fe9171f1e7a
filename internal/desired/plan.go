package desired

import (
	"context"
	"errors"
	"fmt"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// Plan reads the cloud's address plan (intent.PlanKey); a store without
// one is a cloud of the default plan (made before plans could be chosen).
// found says whether the key exists.
func Plan(ctx context.Context, s store.Store) (p addrplan.Plan, found bool, err error) {
	err = store.GetJSON(ctx, s, intent.PlanKey, &p)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return addrplan.Default(), false, nil
	case err != nil:
		return p, false, fmt.Errorf("read the address plan %s: %w", intent.PlanKey, err)
	}
	if err := p.Validate(); err != nil {
		return p, true, fmt.Errorf("the address plan in %s: %w", intent.PlanKey, err)
	}
	return p, true, nil
}

// UsePlan makes the store's plan this process's (addrplan.Set): what every
// daemon does at start, before it composes or decomposes an address.
func UsePlan(ctx context.Context, s store.Store) (addrplan.Plan, error) {
	p, _, err := Plan(ctx, s)
	if err != nil {
		return p, err
	}
	return p, addrplan.Set(p)
}
