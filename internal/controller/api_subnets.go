package controller

import (
	"context"
	"net/http"

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
