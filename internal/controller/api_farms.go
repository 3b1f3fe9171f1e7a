package controller

import (
	"context"
	"errors"
	"net/http"

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
