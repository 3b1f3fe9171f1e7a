// Package desired reads and writes one host's desired state as the keys
// of intent/layout.go: what the lab's readiness check, tests and tools use
// to see a host's state whole. The controller writes the keys piece by
// piece and the agent assembles them from its watch; neither goes through
// here.
package desired

import (
	"context"
	"fmt"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// Read assembles host's desired state from the store: its keys and the
// states of the farms its VMs belong to. found is false when the host has
// no key at all (no VM, sliver or TAP rule).
func Read(ctx context.Context, s store.Store, host string) (d intent.Desired, found bool, err error) {
	keys, _, err := s.List(ctx, intent.DesiredHostPrefix(host))
	if err != nil {
		return d, false, err
	}
	d, err = intent.Assemble(host, keys, nil)
	if err != nil {
		return d, false, err
	}
	farms := map[uint16]intent.FarmState{}
	for _, id := range intent.CarriedFarms(d.Local) {
		var f intent.FarmState
		if err := store.GetJSON(ctx, s, intent.FarmStateKey(id), &f); err == nil {
			farms[id] = f
		} else if err != store.ErrNotFound {
			return d, false, err
		}
	}
	d, err = intent.Assemble(host, keys, farms)
	return d, len(keys) > 0, err
}

// Write makes host d.Node's desired keys exactly d's (deleting the others)
// and writes the farm states d's rules and proxy-ARP farms make, replacing
// those farms' states: for tests and tools that hold a Desired whole.
func Write(ctx context.Context, s store.Store, d intent.Desired) error {
	keys, farms, err := intent.Split(d)
	if err != nil {
		return err
	}
	have, _, err := s.List(ctx, intent.DesiredHostPrefix(d.Node))
	if err != nil {
		return err
	}
	for k := range have {
		if _, ok := keys[k]; !ok {
			if err := s.Delete(ctx, k); err != nil {
				return err
			}
		}
	}
	for k, v := range keys {
		if string(have[k]) == string(v) {
			continue
		}
		if err := s.Put(ctx, k, v); err != nil {
			return err
		}
	}
	for id, f := range farms {
		if err := store.PutJSON(ctx, s, intent.FarmStateKey(id), f); err != nil {
			return fmt.Errorf("farm state %d: %w", id, err)
		}
	}
	return nil
}
