package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// hostRoutes serves hosts: the topology seeds them, the operator adds and
// retires them (a hypervisor joining or leaving a running cloud).
func (c *Controller) hostRoutes(mux *router) {
	mux.HandleFunc("GET /v1/hosts", c.list(intent.HostsPrefix, func() any { return &[]intent.Host{} }))
	mux.HandleFunc("POST /v1/hosts", func(w http.ResponseWriter, r *http.Request) {
		var in intent.Host
		if decode(w, r, &in) {
			h, err := c.AddHost(r.Context(), in)
			reply(w, http.StatusCreated, h, err)
		}
	})
	mux.HandleFunc("GET /v1/hosts/{host}", func(w http.ResponseWriter, r *http.Request) {
		var v HostView
		err := checkPath(r, "host")
		if err == nil {
			v, err = c.GetHost(r.Context(), r.PathValue("host"))
		}
		reply(w, http.StatusOK, v, err)
	})
	mux.HandleFunc("DELETE /v1/hosts/{host}", func(w http.ResponseWriter, r *http.Request) {
		// cascade, as every delete calls it; drain, the name it had first.
		cascade, err := boolQuery(r, "cascade")
		drain := false
		if err == nil {
			drain, err = boolQuery(r, "drain")
		}
		if err == nil {
			err = checkPath(r, "host")
		}
		if err == nil {
			err = c.RemoveHost(r.Context(), r.PathValue("host"), cascade || drain)
		}
		var inUse *HostInUse
		if errors.As(err, &inUse) {
			writeJSON(w, http.StatusConflict, inUse)
			return
		}
		reply(w, http.StatusNoContent, nil, err)
	})
}

// HostView is a host and what is placed on it.
type HostView struct {
	intent.Host
	VMs     []string `json:"vms"`     // FARM/SUBNET/VM
	Slivers []string `json:"slivers"` // HOST/NAME
}

// GetHost returns host's record and what is placed on it.
func (c *Controller) GetHost(ctx context.Context, host string) (HostView, error) {
	var v HostView
	if err := store.GetJSON(ctx, c.store, intent.HostsPrefix+host, &v.Host); errors.Is(err, store.ErrNotFound) {
		return v, notFound("host", "host %s", host)
	} else if err != nil {
		return v, err
	}
	in, err := c.placedOn(ctx, host)
	if err != nil {
		return v, err
	}
	v.VMs, v.Slivers = in.VMs, in.Slivers
	return v, nil
}

// HostInUse is the refusal of a host's removal while guests are placed on
// it: the error (409) names each, so the operator knows what to move or
// delete, or that a drain would delete them.
type HostInUse struct {
	Field   string   `json:"field"`
	Msg     string   `json:"error"`
	VMs     []string `json:"vms"`     // FARM/SUBNET/VM
	Slivers []string `json:"slivers"` // HOST/NAME
	Taps    []string `json:"taps"`    // policies whose sender, receiver or monitor is a VM there
	// Dependants is all of them as every refused delete names them
	// (FieldError.Dependants): "vm NAME", "sliver NAME", "tap NAME".
	Dependants []string `json:"dependants"`
}

func (e *HostInUse) Error() string { return e.Field + ": " + e.Msg }

// Unwrap makes the refusal an ErrConflict.
func (e *HostInUse) Unwrap() error { return ErrConflict }

// empty reports whether nothing is placed.
func (e *HostInUse) empty() bool { return len(e.VMs)+len(e.Slivers)+len(e.Taps) == 0 }

// AddHost authorizes host h: VMs and slivers may be placed on it, and its
// agent, once it runs, registers its uplink (intent.Node) by itself.
// Address, its IPv4 on the fabric, is optional: the controller takes
// agents' addresses from their node records.
func (c *Controller) AddHost(ctx context.Context, h intent.Host) (intent.Host, error) {
	if err := topology.CheckHostName(h.Name); err != nil {
		return h, fieldErr("name", err)
	}
	if h.Address != "" {
		a, err := netip.ParseAddr(h.Address)
		if err != nil || !a.Is4() {
			return h, fieldErr("address", fmt.Errorf("address %q is not an IPv4 address (the host's address on the fabric; leave it out for the agent's own)", h.Address))
		}
		h.Address = a.String()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	hosts, _, err := store.ListJSON[intent.Host](ctx, c.store, intent.HostsPrefix)
	if err != nil {
		return h, err
	}
	for _, o := range hosts {
		if o.Name == h.Name {
			return h, conflict("name", "host %s", h.Name)
		}
		if h.Address != "" && o.Address == h.Address {
			return h, conflict("address", "address %s (host %s's)", h.Address, o.Name)
		}
	}
	// VMs and hosts share one set of node names (CreateVMWithInterface).
	if err := c.view(ctx, func(m *model) error {
		if named := sortedKeys(m.byName[h.Name]); len(named) > 0 {
			return conflict("name", "vm %s (VMs and hosts share one set of node names)", strings.Join(named, ", "))
		}
		return nil
	}); err != nil {
		return h, err
	}
	// Its agent's etcd user first: the agent may connect as soon as the
	// host exists.
	if err := c.grantAgent(ctx, h.Name); err != nil {
		return h, err
	}
	if err := store.PutJSON(ctx, c.store, intent.HostsPrefix+h.Name, h); err != nil {
		return h, errors.Join(err, c.revokeAgent(ctx, h.Name))
	}
	return h, nil
}

// placedOn lists what is placed on host: its VMs, its slivers, and the TAP
// policies that name a VM there.
func (c *Controller) placedOn(ctx context.Context, host string) (*HostInUse, error) {
	in := &HostInUse{Field: "host", VMs: []string{}, Slivers: []string{}, Taps: []string{}}
	vms, _, err := store.ListJSON[intent.VM](ctx, c.store, intent.VMsPrefix)
	if err != nil {
		return nil, err
	}
	for _, v := range vms {
		if v.Host == host {
			in.VMs = append(in.VMs, v.FullName())
		}
	}
	slivers, _, err := store.ListJSON[intent.Sliver](ctx, c.store, intent.HostSliversPrefix(host))
	if err != nil {
		return nil, err
	}
	for _, s := range slivers {
		in.Slivers = append(in.Slivers, s.FullName())
	}
	taps, _, err := store.ListJSON[intent.TapPolicy](ctx, c.store, intent.TapsPrefix)
	if err != nil {
		return nil, err
	}
	for _, p := range taps {
		if slices.Contains(in.VMs, p.Sender) || slices.Contains(in.VMs, p.Receiver) || slices.Contains(in.VMs, p.Monitor) {
			in.Taps = append(in.Taps, p.Name)
		}
	}
	slices.Sort(in.VMs)
	slices.Sort(in.Slivers)
	slices.Sort(in.Taps)
	var what []string
	in.Dependants = []string{}
	for _, l := range []struct {
		kind  string
		names []string
	}{{"vm", in.VMs}, {"sliver", in.Slivers}, {"tap", in.Taps}} {
		if len(l.names) > 0 {
			what = append(what, l.kind+"s "+strings.Join(l.names, ", "))
		}
		for _, n := range l.names {
			in.Dependants = append(in.Dependants, l.kind+" "+n)
		}
	}
	in.Msg = fmt.Sprintf("host %s still carries %s: delete or move them first, or remove it with cascade=true (CLI --cascade, or --drain), which deletes them", host, strings.Join(what, "; "))
	return in, nil
}

// RemoveHost retires host: refused (*HostInUse, 409) while VMs, slivers or
// TAP policies naming its VMs are placed there, unless drain, which deletes
// them first through their own operations (so their desired keys and
// allocations go as on their own DELETE). Then every key of the host goes:
// its record, its desired keys, its agent's etcd user (etcdauth.go), and
// its agent's node and status records. Its agent should be stopped first:
// without etcd auth (--insecure) a running one writes its records again;
// with it, the agent's writes are refused from then on.
func (c *Controller) RemoveHost(ctx context.Context, host string, drain bool) error {
	if _, err := c.store.Get(ctx, intent.HostsPrefix+host); errors.Is(err, store.ErrNotFound) {
		return notFound("host", "host %s", host)
	} else if err != nil {
		return err
	}
	if drain {
		in, err := c.placedOn(ctx, host)
		if err != nil {
			return err
		}
		// Policies first: one naming a VM refers to it by name.
		for _, t := range in.Taps {
			if err := c.DeleteTap(ctx, t); err != nil && !errors.Is(err, ErrNotFound) {
				return fmt.Errorf("drain host %s: tap %s: %w", host, t, err)
			}
		}
		for _, full := range in.VMs {
			parts := strings.SplitN(full, "/", 3)
			if err := c.DeleteVM(ctx, parts[0], parts[1], parts[2]); err != nil && !errors.Is(err, ErrNotFound) {
				return fmt.Errorf("drain host %s: vm %s: %w", host, full, err)
			}
		}
		for _, s := range in.Slivers {
			_, name, _ := strings.Cut(s, "/")
			if err := c.DeleteSliver(ctx, host, name); err != nil && !errors.Is(err, ErrNotFound) {
				return fmt.Errorf("drain host %s: sliver %s: %w", host, s, err)
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Checked again under the lock: something placed during a drain stays
	// refused rather than left on a host that is gone.
	in, err := c.placedOn(ctx, host)
	if err != nil {
		return err
	}
	if !in.empty() {
		return in
	}
	// The record first: the model then deletes the host's desired keys
	// itself, keeping what it knows of the store true.
	if err := c.store.Delete(ctx, intent.HostsPrefix+host); err != nil {
		return err
	}
	if _, err := c.CompileOnce(ctx); err != nil {
		return fmt.Errorf("compile after removing host %s: %w", host, err)
	}
	// What is left is no part's: the agent's own records, and any key
	// under the host's prefixes a newer controller or a crash left (the
	// model, which knew none of them, is reloaded if there was one).
	behind := false
	for _, prefix := range []string{intent.DesiredHostPrefix(host), intent.HostSliversPrefix(host)} {
		kvs, _, err := c.raw.List(ctx, prefix)
		if err != nil {
			return err
		}
		for k := range kvs {
			if err := c.raw.Delete(ctx, k); err != nil {
				return err
			}
			behind = true
		}
	}
	if behind {
		c.invalidate()
	}
	// Its agent loses its etcd user before its records go, so a running
	// one cannot write them again.
	if err := c.revokeAgent(ctx, host); err != nil {
		return err
	}
	for _, k := range []string{intent.NodesPrefix + host, intent.StatusPrefix + host, intent.LeaseSpaceKey(host)} {
		if err := c.raw.Delete(ctx, k); err != nil {
			return err
		}
	}
	return nil
}
