package controller

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// farmRoutes serves farms: a tenant's network, 10.f.0.0/16.
func (c *Controller) farmRoutes(mux *router) {
	mux.HandleFunc("GET /v1/farms", c.farmList(intent.FarmsPrefix, func() any { return &[]intent.Farm{} }))
	mux.HandleFunc("POST /v1/farms", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Name     string `json:"name"`
			ProxyARP bool   `json:"proxyARP"`
		}
		if decode(w, r, &in) {
			noteFarm(r.Context(), in.Name)
			f, err := c.CreateFarm(r.Context(), in.Name, in.ProxyARP)
			reply(w, http.StatusCreated, f, err)
		}
	})
	mux.HandleFunc("GET /v1/farms/{farm}", func(w http.ResponseWriter, r *http.Request) {
		if err := checkPath(r, "farm"); err != nil {
			reply(w, 0, nil, err)
			return
		}
		f, err := c.getFarm(r.Context(), r.PathValue("farm"))
		reply(w, http.StatusOK, f, err)
	})
	mux.HandleFunc("DELETE /v1/farms/{farm}", func(w http.ResponseWriter, r *http.Request) {
		cascade, err := boolQuery(r, "cascade")
		if err == nil {
			err = checkPath(r, "farm")
		}
		if err == nil {
			err = c.DeleteFarm(r.Context(), r.PathValue("farm"), cascade)
		}
		reply(w, http.StatusNoContent, nil, err)
	})
}

func (c *Controller) getFarm(ctx context.Context, name string) (intent.Farm, error) {
	var f intent.Farm
	err := store.GetJSON(ctx, c.store, intent.FarmsPrefix+name, &f)
	if errors.Is(err, store.ErrNotFound) {
		return f, notFound("farm", "farm %q", name)
	}
	return f, err
}

// CreateFarm creates a farm and allocates its id (the f of 10.f.s.h).
func (c *Controller) CreateFarm(ctx context.Context, name string, proxyARP bool) (intent.Farm, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := topology.CheckFarmName(name); err != nil {
		return intent.Farm{}, fieldErr("name", err)
	}
	if _, err := c.getFarm(ctx, name); err == nil {
		return intent.Farm{}, conflict("name", "farm %q", name)
	}
	// Tokens naming a farm that is not there predate its delete (one
	// made before deletes revoked them, or a delete that failed half
	// way): the new farm's tenant is not theirs.
	if err := c.revokeFarmTokens(ctx, name); err != nil {
		return intent.Farm{}, err
	}
	a, err := c.alloc(ctx)
	if err != nil {
		return intent.Farm{}, err
	}
	id, err := a.Farm(name)
	if err != nil {
		return intent.Farm{}, allocErr("name", err)
	}
	f := intent.Farm{Name: name, ID: id, ProxyARP: proxyARP}
	if err := c.saveAlloc(ctx, a); err != nil {
		return f, err
	}
	return f, store.PutJSON(ctx, c.store, intent.FarmsPrefix+name, f)
}

// DeleteFarm removes farm name and frees its id, and its subnets' ids,
// for the next farm created. Refused (409, naming them) while it has
// subnets or VMs, another farm's rule names a subnet of it or peers with
// it, or a TAP policy names a VM or subnet of it; with cascade those go
// first (refuseOrCascade). Its farm state goes from the store with its
// record, and with it every host's entries for it. Its tenant tokens are
// revoked before the record goes (revokeFarmTokens), and its tenant
// certificates issued until then (revokeFarmCerts), so a farm made again
// under the same name starts with no credential.
func (c *Controller) DeleteFarm(ctx context.Context, name string, cascade bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.getFarm(ctx, name); err != nil {
		return err
	}
	if err := c.refuseOrCascade(ctx, deletion{farm: name}, cascade); err != nil {
		return err
	}
	// Before the record: a failure between leaves a farm without some
	// of its tokens, which the delete's retry finishes, never tokens
	// without their farm, which a new farm of the name would inherit.
	if err := c.revokeFarmTokens(ctx, name); err != nil {
		return err
	}
	if err := c.revokeFarmCerts(ctx, name); err != nil {
		return err
	}
	// The record first: a failure after it leaves an id unused, never an
	// id two farms hold.
	if err := c.store.Delete(ctx, intent.FarmsPrefix+name); err != nil {
		return err
	}
	a, err := c.allocIn(ctx, name+"/")
	if err != nil {
		return err
	}
	delete(a.Farms, name)
	for sub := range a.Subnets {
		if strings.HasPrefix(sub, name+"/") {
			delete(a.Subnets, sub)
		}
	}
	return c.saveAlloc(ctx, a, name+"/")
}
