package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// leaseSpace is one host's lease space as one writer read it: every lease
// of the host's address (docs/north-south.md: one lease space per address).
// A writer changes claims and says what else to write; writeLeases lands
// both in one transaction. decide returning no ops writes nothing; one
// that says its writes take no ports (a VM record whose slice, or lack of
// one, stays as it was) has them written as they are, since no other
// writer's decision depends on them.
type leaseSpace struct {
	host    string
	slivers []intent.Sliver
	// claims are the live egress slices by FARM/SUBNET/VM.
	claims map[string]intent.Lease
}

// holders are the slices but except's, each as a holder of leases named
// "egress slice of FARM/SUBNET/VM": what a lease is checked against beside
// the slivers (lease.Overlap).
func (ls *leaseSpace) holders(except string) []intent.Sliver {
	names := make([]string, 0, len(ls.claims))
	for full := range ls.claims {
		if full != except {
			names = append(names, full)
		}
	}
	sort.Strings(names)
	out := make([]intent.Sliver, len(names))
	for i, full := range names {
		out[i] = intent.Sliver{Host: ls.host, Name: "egress slice of " + full, Leases: []intent.Lease{ls.claims[full]}}
	}
	return out
}

// taken is every lease of the host's address but vm's own slice.
func (ls *leaseSpace) taken(vm string) []intent.Lease {
	var out []intent.Lease
	for _, s := range ls.slivers {
		out = append(out, s.Leases...)
	}
	for full, l := range ls.claims {
		if full != vm {
			out = append(out, l)
		}
	}
	return out
}

// writeLeases is the one way a lease of host's address is written, by
// slivers, slices and whatever leases ports of it next: read the host's
// lease space, let decide change its claims and say what to write, and
// write that together with the lease space key, only if that key is
// unchanged since the read (store.WriteIfUnchanged). Every writer writes
// the key, so two writers that read the same lease space can never both
// land: the second decides again on what the first wrote. That is one
// etcd transaction, not a lock, so it holds between controllers too
// (c.mu orders only this one's writers), and a writer that dies midway
// leaves nothing held. Freeing needs no turn: a sliver or VM deleted
// without it only frees ports (its claim is dropped at the next turn).
func (c *Controller) writeLeases(ctx context.Context, host, what string, decide func(ls *leaseSpace) (ops []store.Op, takes bool, err error)) error {
	for attempt := 0; attempt < decideRetries; attempt++ {
		ls, rev, err := c.readLeases(ctx, host)
		if err != nil {
			return err
		}
		ops, takes, err := decide(ls)
		if err != nil || ops == nil {
			return err
		}
		if !takes {
			for _, o := range ops {
				if err := c.store.Put(ctx, o.Key, o.Value); err != nil {
					return err
				}
			}
			return nil
		}
		b, err := json.Marshal(intent.LeaseSpace{Slices: ls.claims})
		if err != nil {
			return fmt.Errorf("encode lease space of host %s: %w", host, err)
		}
		ops = append(ops, store.Op{Key: intent.LeaseSpaceKey(host), Value: b})
		ok, err := c.store.WriteIfUnchanged(ctx, intent.HostLeaseSpacePrefix(host), rev, ops)
		if err != nil || ok {
			return err
		}
		c.log.Info("lease write raced another writer of the host's lease space; deciding again", "what", what, "host", host, "attempt", attempt+1)
	}
	return fmt.Errorf("%s: host %s's lease space kept changing under %d attempts to write it", what, host, decideRetries)
}

// readLeases reads host's lease space, and the revision a writer compares
// with: the key first, so what is read after it is at least as new, and a
// change after it fails the write.
func (c *Controller) readLeases(ctx context.Context, host string) (*leaseSpace, int64, error) {
	kvs, rev, err := c.store.List(ctx, intent.HostLeaseSpacePrefix(host))
	if err != nil {
		return nil, 0, err
	}
	var rec intent.LeaseSpace
	if b, ok := kvs[intent.LeaseSpaceKey(host)]; ok {
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, 0, fmt.Errorf("decode %s: %w", intent.LeaseSpaceKey(host), err)
		}
	}
	slivers, err := c.hostSlivers(ctx, host)
	if err != nil {
		return nil, 0, err
	}
	claims, err := c.liveClaims(ctx, host, rec.Slices)
	if err != nil {
		return nil, 0, err
	}
	return &leaseSpace{host: host, slivers: slivers, claims: claims}, rev, nil
}

// liveClaims are the slices host's VMs hold: every claim whose VM's record
// holds a slice on host, as the record has it, and every slice the model
// knows on host besides (so a store from before the lease space key is
// held all the same). The model knows this controller's writes; a claim it
// does not confirm is read from the store, which is at least as new.
func (c *Controller) liveClaims(ctx context.Context, host string, claims map[string]intent.Lease) (map[string]intent.Lease, error) {
	out := map[string]intent.Lease{}
	var unsure []string
	if err := c.view(ctx, func(m *model) error {
		for full := range m.onHost[host] {
			if v := m.vms[full]; v.Egress != nil {
				out[full] = v.Egress.Slice
			}
		}
		for full, l := range claims {
			if got, ok := out[full]; !ok || got != l {
				unsure = append(unsure, full)
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	// The store is at least as new as the model: what it says of a VM wins.
	for _, full := range unsure {
		var v intent.VM
		err := store.GetJSON(ctx, c.store, intent.VMsPrefix+full, &v)
		switch {
		case errors.Is(err, store.ErrNotFound):
			delete(out, full)
		case err != nil:
			return nil, err
		case v.Host == host && v.Egress != nil:
			out[full] = v.Egress.Slice
		default:
			delete(out, full)
		}
	}
	return out, nil
}
