package controller

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ipam"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// subnetRoutes serves subnets: a /24 of a farm, gateway at .1.
func (c *Controller) subnetRoutes(mux *router) {
	mux.HandleFunc("GET /v1/subnets", c.farmList(intent.SubnetsPrefix, func() any { return &[]intent.Subnet{} }))
	mux.HandleFunc("POST /v1/farms/{farm}/subnets", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Name string `json:"name"`
		}
		if decode(w, r, &in) {
			s, err := c.CreateSubnet(r.Context(), r.PathValue("farm"), in.Name)
			reply(w, http.StatusCreated, s, err)
		}
	})
	mux.HandleFunc("GET /v1/farms/{farm}/subnets", func(w http.ResponseWriter, r *http.Request) {
		out, err := c.farmSubnets(r)
		reply(w, http.StatusOK, out, err)
	})
	mux.HandleFunc("GET /v1/farms/{farm}/subnets/{subnet}", func(w http.ResponseWriter, r *http.Request) {
		var s intent.Subnet
		err := checkPath(r, "farm", "subnet")
		if err == nil {
			s, err = c.getSubnet(r.Context(), r.PathValue("farm"), r.PathValue("subnet"))
		}
		reply(w, http.StatusOK, s, err)
	})
	mux.HandleFunc("DELETE /v1/farms/{farm}/subnets/{subnet}", func(w http.ResponseWriter, r *http.Request) {
		cascade, err := boolQuery(r, "cascade")
		if err == nil {
			err = checkPath(r, "farm", "subnet")
		}
		if err == nil {
			err = c.DeleteSubnet(r.Context(), r.PathValue("farm"), r.PathValue("subnet"), cascade)
		}
		reply(w, http.StatusNoContent, nil, err)
	})
}

// farmSubnets lists the subnets of r's farm, by name.
func (c *Controller) farmSubnets(r *http.Request) ([]intent.Subnet, error) {
	if err := checkPath(r, "farm"); err != nil {
		return nil, err
	}
	farm := r.PathValue("farm")
	if _, err := c.getFarm(r.Context(), farm); err != nil {
		return nil, err
	}
	out, _, err := store.ListJSON[intent.Subnet](r.Context(), c.store, intent.SubnetsPrefix+farm+"/")
	slices.SortFunc(out, func(a, b intent.Subnet) int { return strings.Compare(a.Name, b.Name) })
	return out, err
}

// getSubnet reads farm/name: 404 naming the farm when there is no such
// farm, the subnet when the farm has no such subnet.
func (c *Controller) getSubnet(ctx context.Context, farm, name string) (intent.Subnet, error) {
	var s intent.Subnet
	if _, err := c.getFarm(ctx, farm); err != nil {
		return s, err
	}
	err := store.GetJSON(ctx, c.store, intent.SubnetKey(farm, name), &s)
	if errors.Is(err, store.ErrNotFound) {
		return s, notFound("subnet", "subnet %s/%s", farm, name)
	}
	return s, err
}

// DeleteSubnet removes farm/name and frees its id and its VMs' ids for
// the next subnet and VMs created. Refused (409, naming them) while it
// has VMs, a rule names it or a TAP policy names it or a VM of it; with
// cascade those go first (refuseOrCascade).
func (c *Controller) DeleteSubnet(ctx context.Context, farm, name string, cascade bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.getSubnet(ctx, farm, name); err != nil {
		return err
	}
	if err := c.refuseOrCascade(ctx, deletion{farm: farm, subnet: name}, cascade); err != nil {
		return err
	}
	return c.dropSubnet(ctx, farm, name)
}

// dropSubnet deletes farm/name's record, then its id and its VMs' ids
// (its key of intent.VMIDsPrefix): in that order, so that a failure
// between leaves an id unused, never one two subnets hold. c.mu is held.
func (c *Controller) dropSubnet(ctx context.Context, farm, name string) error {
	full := farm + "/" + name
	if err := c.store.Delete(ctx, intent.SubnetKey(farm, name)); err != nil {
		return err
	}
	a, err := c.allocIn(ctx, full)
	if err != nil {
		return err
	}
	delete(a.Subnets, full)
	for vm := range a.VMs {
		if strings.HasPrefix(vm, full+"/") {
			delete(a.VMs, vm)
		}
	}
	return c.saveAlloc(ctx, a, full)
}

// CreateSubnet creates farm/name, a /24 with its gateway at .1.
func (c *Controller) CreateSubnet(ctx context.Context, farm, name string) (intent.Subnet, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := topology.CheckSubnetName(name); err != nil {
		return intent.Subnet{}, fieldErr("name", err)
	}
	f, err := c.getFarm(ctx, farm)
	if err != nil {
		return intent.Subnet{}, err
	}
	key := intent.SubnetKey(farm, name)
	if _, err := c.store.Get(ctx, key); err == nil {
		return intent.Subnet{}, conflict("name", "subnet %s/%s", farm, name)
	}
	a, err := c.alloc(ctx)
	if err != nil {
		return intent.Subnet{}, err
	}
	sid, err := a.Subnet(farm, name)
	if err != nil {
		return intent.Subnet{}, allocErr("farm", err)
	}
	s := intent.Subnet{Farm: farm, Name: name, ID: sid, Prefix: ipam.SubnetPrefix(f.ID, sid).String(), Gateway: ipam.Gateway(f.ID, sid).String()}
	if err := c.saveAlloc(ctx, a); err != nil {
		return s, err
	}
	return s, store.PutJSON(ctx, c.store, key, s)
}
