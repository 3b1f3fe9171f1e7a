package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"

	"github.com/onehop/onehop/internal/egressspec"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lease"
	"github.com/onehop/onehop/internal/store"
)

// egressRoutes serves a farm's egress setting (docs/north-south.md). A
// tenant sets its own farm's (scopeFarm); the slice size is bounded by
// egressspec.MaxSlice for everyone, so no tenant takes a host's ports alone.
func (c *Controller) egressRoutes(mux *router) {
	mux.HandleFunc("PUT /v1/farms/{farm}/egress", func(w http.ResponseWriter, r *http.Request) {
		if err := checkPath(r, "farm"); err != nil {
			reply(w, 0, nil, err)
			return
		}
		var in egressspec.Setting
		if decode(w, r, &in) {
			f, err := c.SetFarmEgress(r.Context(), r.PathValue("farm"), in)
			reply(w, http.StatusOK, f, err)
		}
	})
}

// SetFarmEgress turns farm's egress on (with its destinations and slice
// size) or off, and gives each of its VMs a slice of its host's address,
// or takes it back. A VM whose host has no room for its slice fails the
// whole change, naming it; VMs changed before it keep what they got, and
// the same call again finishes the rest.
func (c *Controller) SetFarmEgress(ctx context.Context, farm string, s egressspec.Setting) (intent.Farm, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, err := c.getFarm(ctx, farm)
	if err != nil {
		return f, err
	}
	eg, err := egressspec.Farm(s)
	if err != nil {
		return f, fieldErr("egress", err)
	}
	f.Egress = eg
	if err := store.PutJSON(ctx, c.store, intent.FarmsPrefix+farm, f); err != nil {
		return f, err
	}
	var vms []intent.VM
	if err := c.view(ctx, func(m *model) error {
		for _, v := range m.vms {
			if v.Farm == farm {
				vms = append(vms, v)
			}
		}
		return nil
	}); err != nil {
		return f, err
	}
	sort.Slice(vms, func(i, j int) bool { return vms[i].FullName() < vms[j].FullName() })
	for _, v := range vms {
		nv, err := c.withEgress(ctx, v, f.Egress)
		if err != nil {
			return f, err
		}
		if equalJSON(nv.Egress, v.Egress) {
			continue
		}
		if err := store.PutJSON(ctx, c.store, intent.VMsPrefix+nv.FullName(), nv); err != nil {
			return f, err
		}
	}
	return f, nil
}

// withEgress is v as its farm's egress setting eg wants it on v.Host: no
// slice when off; its slice kept while it has the size asked for on this
// host; else a free one of the host's address (lease.FreeSlice). Called
// with c.mu held, so two VMs' slices are never decided at once.
func (c *Controller) withEgress(ctx context.Context, v intent.VM, eg *intent.FarmEgress) (intent.VM, error) {
	if eg == nil {
		v.Egress = nil
		return v, nil
	}
	if v.Egress != nil && v.Egress.Slice.Hi-v.Egress.Slice.Lo+1 == eg.Slice {
		v.Egress = &intent.VMEgress{Slice: v.Egress.Slice, To: append([]string(nil), eg.To...)}
		return v, nil
	}
	taken, err := c.hostLeases(ctx, v.Host, v.FullName())
	if err != nil {
		return v, err
	}
	// Its own published ports, which a move takes before the model has
	// the VM on its new host.
	for _, p := range v.Published {
		taken = append(taken, p.Lease())
	}
	node, err := c.node(ctx, v.Host)
	if err != nil {
		return v, err
	}
	lo, hi := lease.Ephemeral(node)
	sl, err := lease.FreeSlice(0, eg.Slice, taken, lo, hi)
	if err != nil {
		return v, full("egress", fmt.Errorf("vm %s on host %s: %w", v.FullName(), v.Host, err))
	}
	v.Egress = &intent.VMEgress{Slice: sl, To: append([]string(nil), eg.To...)}
	return v, nil
}

// hostLeases is every lease of host's address but vm's own: its slivers'
// leases and its other VMs' egress slices (one lease space per address).
func (c *Controller) hostLeases(ctx context.Context, host, vm string) ([]intent.Lease, error) {
	var taken []intent.Lease
	slivers, err := c.hostSlivers(ctx, host)
	if err != nil {
		return nil, err
	}
	for _, s := range slivers {
		taken = append(taken, s.Leases...)
	}
	for _, s := range c.hostSlices(ctx, host, vm) {
		taken = append(taken, s.Leases...)
	}
	return taken, nil
}

// hostSlices are the egress slices of host's VMs but except's, each as a
// holder of leases named "egress slice of FARM/SUBNET/VM", and every
// published port of its VMs (except's too: a VM's slice never takes its
// own published ports), each named publicationHolder: what a sliver's
// lease, a slice or a publication is checked against beside slivers
// (lease.Overlap).
func (c *Controller) hostSlices(ctx context.Context, host, except string) []intent.Sliver {
	var out []intent.Sliver
	_ = c.view(ctx, func(m *model) error {
		for full := range m.onHost[host] {
			v := m.vms[full]
			for _, p := range v.Published {
				out = append(out, intent.Sliver{Host: host, Name: publicationHolder(full, p), Leases: []intent.Lease{p.Lease()}})
			}
			if full == except || v.Egress == nil {
				continue
			}
			out = append(out, intent.Sliver{Host: host, Name: "egress slice of " + full, Leases: []intent.Lease{v.Egress.Slice}})
		}
		return nil
	})
	return out
}

// hostSlivers lists host's slivers from the store.
func (c *Controller) hostSlivers(ctx context.Context, host string) ([]intent.Sliver, error) {
	kvs, _, err := c.store.List(ctx, intent.HostSliversPrefix(host))
	if err != nil {
		return nil, err
	}
	var out []intent.Sliver
	for k, b := range kvs {
		var s intent.Sliver
		if err := json.Unmarshal(b, &s); err != nil {
			return nil, fmt.Errorf("sliver %s: %w", k, err)
		}
		out = append(out, s)
	}
	return out, nil
}
