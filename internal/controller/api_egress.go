package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
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
	mux.HandleFunc("PUT /v1/farms/{farm}/subnets/{subnet}/egress", func(w http.ResponseWriter, r *http.Request) {
		if err := checkPath(r, "farm", "subnet"); err != nil {
			reply(w, 0, nil, err)
			return
		}
		var in egressspec.Setting
		if decode(w, r, &in) {
			s, err := c.SetSubnetEgress(r.Context(), r.PathValue("farm"), r.PathValue("subnet"), &in)
			reply(w, http.StatusOK, s, err)
		}
	})
	mux.HandleFunc("DELETE /v1/farms/{farm}/subnets/{subnet}/egress", func(w http.ResponseWriter, r *http.Request) {
		if err := checkPath(r, "farm", "subnet"); err != nil {
			reply(w, 0, nil, err)
			return
		}
		s, err := c.SetSubnetEgress(r.Context(), r.PathValue("farm"), r.PathValue("subnet"), nil)
		reply(w, http.StatusOK, s, err)
	})
}

// SetSubnetEgress gives subnet farm/name its own egress setting, which
// overrides its farm's (nil: none, the farm's applies again), and gives or
// takes back its VMs' slices as SetFarmEgress does.
func (c *Controller) SetSubnetEgress(ctx context.Context, farm, name string, s *egressspec.Setting) (intent.Subnet, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sub, err := c.getSubnet(ctx, farm, name)
	if err != nil {
		return sub, err
	}
	sub.Egress = nil
	if s != nil {
		if sub.Egress, err = egressspec.Subnet(*s); err != nil {
			return sub, fieldErr("egress", err)
		}
	}
	if err := store.PutJSON(ctx, c.store, intent.SubnetKey(farm, name), sub); err != nil {
		return sub, err
	}
	return sub, c.followEgress(ctx, farm, name)
}

// egressOf is the egress farm's subnet's VMs get (intent.EffectiveEgress).
func (c *Controller) egressOf(ctx context.Context, farm, subnet string) (*intent.FarmEgress, error) {
	f, err := c.getFarm(ctx, farm)
	if err != nil {
		return nil, err
	}
	sub, err := c.getSubnet(ctx, farm, subnet)
	if err != nil {
		return nil, err
	}
	return intent.EffectiveEgress(f.Egress, sub.Egress), nil
}

// followEgress gives farm's VMs (only subnet's, unless "") the slices
// their subnet's effective setting wants, or takes them back. A VM whose
// host has no room for its slice fails the whole change, naming it; VMs
// changed before it keep what they got, and the same call again finishes
// the rest. c.mu is held.
func (c *Controller) followEgress(ctx context.Context, farm, subnet string) error {
	f, err := c.getFarm(ctx, farm)
	if err != nil {
		return err
	}
	subs, _, err := store.ListJSON[intent.Subnet](ctx, c.store, intent.SubnetsPrefix+farm+"/")
	if err != nil {
		return err
	}
	own := map[string]*intent.SubnetEgress{}
	for _, s := range subs {
		own[s.Name] = s.Egress
	}
	var vms []intent.VM
	if err := c.view(ctx, func(m *model) error {
		for _, v := range m.vms {
			if v.Farm == farm && (subnet == "" || v.Subnet == subnet) {
				vms = append(vms, v)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	sort.Slice(vms, func(i, j int) bool { return vms[i].FullName() < vms[j].FullName() })
	for _, v := range vms {
		if _, err := c.putVM(ctx, intent.VMsPrefix+v.FullName(), v, intent.EffectiveEgress(f.Egress, own[v.Subnet])); err != nil {
			return err
		}
	}
	return nil
}

// SetFarmEgress turns farm's egress on (with its destinations and slice
// size) or off, and gives each of its VMs a slice of its host's address,
// or takes it back (followEgress), but in a subnet whose own setting
// overrides the farm's (SetSubnetEgress).
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
	return f, c.followEgress(ctx, farm, "")
}

// putVM writes v under key with the egress eg wants for it on v.Host
// (withEgress), decided in the host's lease space and written in one
// transaction with the claim of its slice (writeLeases). A VM whose
// record would not change is not written.
func (c *Controller) putVM(ctx context.Context, key string, v intent.VM, eg *intent.FarmEgress) (intent.VM, error) {
	out := v
	err := c.writeLeases(ctx, v.Host, "vm "+v.FullName(), func(ls *leaseSpace) ([]store.Op, bool, error) {
		had, claimed := ls.claims[v.FullName()]
		// Its published ports, checked again here: a move brings them
		// to a host whose lease space may have changed since withPublished.
		if err := c.checkPublished(ctx, ls, v); err != nil {
			return nil, false, err
		}
		nv, err := c.withEgress(ctx, ls, v, eg)
		if err != nil {
			return nil, false, err
		}
		out = nv
		now, claims := ls.claims[v.FullName()]
		takes := ls.setPublished(v.FullName(), nv.Published) || claimed != claims || had != now
		if !takes && c.unchanged(ctx, key, nv) {
			return nil, false, nil
		}
		b, err := json.Marshal(nv)
		if err != nil {
			return nil, false, fmt.Errorf("encode vm %s: %w", nv.FullName(), err)
		}
		return []store.Op{{Key: key, Value: b}}, takes, nil
	})
	return out, err
}

// unchanged reports whether key holds v already.
func (c *Controller) unchanged(ctx context.Context, key string, v intent.VM) bool {
	var have intent.VM
	return store.GetJSON(ctx, c.store, key, &have) == nil && equalJSON(have, v)
}

// checkEgressRoom refuses v when its host has no room for the slice eg
// wants for it, before anything of v is written.
func (c *Controller) checkEgressRoom(ctx context.Context, v intent.VM, eg *intent.FarmEgress) error {
	if eg == nil {
		return nil
	}
	ls, _, err := c.readLeases(ctx, v.Host)
	if err != nil {
		return err
	}
	_, err = c.withEgress(ctx, ls, v, eg)
	return err
}

// withEgress is v as its farm's egress setting eg wants it in ls, its
// host's lease space, whose claims it changes to match: no slice when off;
// its slice kept while it has the size asked for and nobody else holds
// any of it; else a free one of the host's address (lease.FreeSlice).
func (c *Controller) withEgress(ctx context.Context, ls *leaseSpace, v intent.VM, eg *intent.FarmEgress) (intent.VM, error) {
	name := v.FullName()
	if eg == nil {
		v.Egress = nil
		delete(ls.claims, name)
		return v, nil
	}
	node, err := c.node(ctx, v.Host)
	if err != nil {
		return v, err
	}
	lo, hi := lease.Ephemeral(node)
	// Its own published ports, which a move brings before the lease space
	// has them on its new host: a slice never takes them either.
	own := publicationHolders(v.Host, name, v.Published)
	if v.Egress != nil && v.Egress.Slice.Hi-v.Egress.Slice.Lo+1 == eg.Slice &&
		lease.Overlap(v.Host, "egress slice of "+name, []intent.Lease{v.Egress.Slice}, slices.Concat(ls.slivers, ls.holders(name), own), lo, hi) == nil {
		v.Egress = &intent.VMEgress{Slice: v.Egress.Slice, To: append([]string(nil), eg.To...)}
		ls.claims[name] = v.Egress.Slice
		return v, nil
	}
	taken := ls.taken(name)
	for _, p := range v.Published {
		taken = append(taken, p.Lease())
	}
	sl, err := lease.FreeSlice(0, eg.Slice, taken, lo, hi)
	if err != nil {
		return v, full("egress", fmt.Errorf("vm %s on host %s: %w", name, v.Host, err))
	}
	v.Egress = &intent.VMEgress{Slice: sl, To: append([]string(nil), eg.To...)}
	ls.claims[name] = sl
	return v, nil
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
