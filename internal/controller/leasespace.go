package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

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
	// published are the live published ports by FARM/SUBNET/VM
	// (api_publish.go).
	published map[string][]intent.Publication
}

// holders are the slices and published ports of the host's VMs but
// except's, each as a holder of leases named "egress slice of
// FARM/SUBNET/VM" or publicationHolder's name: what a lease is checked
// against beside the slivers (lease.Overlap).
func (ls *leaseSpace) holders(except string) []intent.Sliver {
	names := map[string]bool{}
	for full := range ls.claims {
		names[full] = true
	}
	for full := range ls.published {
		names[full] = true
	}
	delete(names, except)
	var out []intent.Sliver
	for _, full := range slices.Sorted(maps.Keys(names)) {
		if l, ok := ls.claims[full]; ok {
			out = append(out, intent.Sliver{Host: ls.host, Name: "egress slice of " + full, Leases: []intent.Lease{l}})
		}
		out = append(out, publicationHolders(ls.host, full, ls.published[full])...)
	}
	return out
}

// publicationHolders are vm's publications ps as holders of host's ports.
func publicationHolders(host, vm string, ps []intent.Publication) []intent.Sliver {
	out := make([]intent.Sliver, 0, len(ps))
	for _, p := range ps {
		out = append(out, intent.Sliver{Host: host, Name: publicationHolder(vm, p), Leases: []intent.Lease{p.Lease()}})
	}
	return out
}

// taken is every lease of the host's address but vm's own slice and
// published ports.
func (ls *leaseSpace) taken(vm string) []intent.Lease {
	var out []intent.Lease
	for _, s := range append(slices.Clone(ls.slivers), ls.holders(vm)...) {
		out = append(out, s.Leases...)
	}
	return out
}

// setPublished records vm's published ports ps (none: forgets them) and
// reports whether that changed them.
func (ls *leaseSpace) setPublished(vm string, ps []intent.Publication) bool {
	if slices.Equal(ls.published[vm], ps) {
		return false
	}
	if len(ps) == 0 {
		delete(ls.published, vm)
	} else {
		ls.published[vm] = slices.Clone(ps)
	}
	return true
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
		b, err := json.Marshal(intent.LeaseSpace{Slices: ls.claims, Published: ls.published})
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
	claims, published, err := c.liveClaims(ctx, host, rec)
	if err != nil {
		return nil, 0, err
	}
	return &leaseSpace{host: host, slivers: slivers, claims: claims, published: published}, rev, nil
}

// liveClaims are the slices and published ports host's VMs hold: every
// claim of rec whose VM's record holds it on host, as the record has it,
// and every one the model knows on host besides (so a store from before
// the lease space key is held all the same). The model knows this
// controller's writes; a claim it does not confirm is read from the store,
// which is at least as new.
func (c *Controller) liveClaims(ctx context.Context, host string, rec intent.LeaseSpace) (map[string]intent.Lease, map[string][]intent.Publication, error) {
	claims, published := map[string]intent.Lease{}, map[string][]intent.Publication{}
	unsure := map[string]bool{}
	if err := c.view(ctx, func(m *model) error {
		for full := range m.onHost[host] {
			v := m.vms[full]
			if v.Egress != nil {
				claims[full] = v.Egress.Slice
			}
			if len(v.Published) > 0 {
				published[full] = slices.Clone(v.Published)
			}
		}
		for full, l := range rec.Slices {
			if got, ok := claims[full]; !ok || got != l {
				unsure[full] = true
			}
		}
		for full, ps := range rec.Published {
			if !slices.Equal(published[full], ps) {
				unsure[full] = true
			}
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	// The store is at least as new as the model: what it says of a VM wins.
	for full := range unsure {
		delete(claims, full)
		delete(published, full)
		var v intent.VM
		err := store.GetJSON(ctx, c.store, intent.VMsPrefix+full, &v)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return nil, nil, err
		case v.Host == host:
			if v.Egress != nil {
				claims[full] = v.Egress.Slice
			}
			if len(v.Published) > 0 {
				published[full] = v.Published
			}
		}
	}
	return claims, published, nil
}
