package controller

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/desired"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// PlanInfo is the cloud's address plan as the API shows it (docs/addressing.md):
// the plan in the form `onehop plan set` and --plan take, its parts, and
// what it holds.
type PlanInfo struct {
	Plan       string `json:"plan"`
	Prefix     string `json:"prefix"`
	FarmBits   int    `json:"farmBits"`
	SubnetBits int    `json:"subnetBits"`
	VMBits     int    `json:"vmBits"`
	MaxFarms   int    `json:"maxFarms"`
	MaxSubnets int    `json:"maxSubnets"` // per farm
	MaxVMs     int    `json:"maxVMs"`     // per subnet
}

// InfoOf is p as the API shows it.
func InfoOf(p addrplan.Plan) PlanInfo {
	return PlanInfo{Plan: p.String(), Prefix: p.Prefix.String(), FarmBits: p.FarmBits, SubnetBits: p.SubnetBits,
		VMBits: p.VMBits, MaxFarms: p.MaxFarms(), MaxSubnets: p.MaxSubnets(), MaxVMs: p.MaxVMs()}
}

// planRoutes serves the address plan: everyone reads it (a tenant's CNI
// plugin needs its subnets' length); the operator sets it while the cloud
// is empty.
func (c *Controller) planRoutes(mux *router) {
	mux.HandleFunc("GET /v1/plan", func(w http.ResponseWriter, r *http.Request) {
		p, _, err := desired.Plan(r.Context(), c.raw)
		reply(w, http.StatusOK, InfoOf(p), err)
	})
	mux.HandleFunc("PUT /v1/plan", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Plan string `json:"plan"`
		}
		if decode(w, r, &in) {
			p, err := addrplan.Parse(in.Plan)
			if err != nil {
				reply(w, http.StatusOK, nil, &FieldError{Field: "plan", Msg: err.Error()})
				return
			}
			err = c.SetPlan(r.Context(), p)
			reply(w, http.StatusOK, InfoOf(p), err)
		}
	})
}

// SetPlan makes p the cloud's address plan and this process's. A plan is
// chosen once: it may change only while the cloud holds no host and no
// farm, for every address, key and scope MAC already made follows the old
// one; otherwise the answer is a 409 naming what the cloud holds.
func (c *Controller) SetPlan(ctx context.Context, p addrplan.Plan) error {
	if err := p.Validate(); err != nil {
		return &FieldError{Field: "plan", Msg: err.Error()}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cur, found, err := desired.Plan(ctx, c.raw)
	if err != nil {
		return err
	}
	if cur != p {
		held, err := c.cloudHolds(ctx)
		if err != nil {
			return err
		}
		if len(held) > 0 {
			return &FieldError{Field: "plan", kind: ErrConflict, Dependants: held,
				Msg: fmt.Sprintf("the address plan is %v and cannot become %v: the cloud holds %s, whose addresses follow the plan in force; a plan is chosen before anything is created",
					cur, p, strings.Join(held, ", "))}
		}
	}
	if cur != p || !found {
		if err := store.PutJSON(ctx, c.raw, intent.PlanKey, p); err != nil {
			return fmt.Errorf("write the address plan: %w", err)
		}
		c.log.Info("address plan", "plan", p.String(), "max_farms", p.MaxFarms(), "max_subnets", p.MaxSubnets(), "max_vms", p.MaxVMs())
	}
	return addrplan.Set(p)
}

// UseStoredPlan makes the store's plan this process's, recording the
// default in a store that has none (a cloud made before plans could be
// chosen holds default addresses).
func (c *Controller) UseStoredPlan(ctx context.Context) (addrplan.Plan, error) {
	p, _, err := desired.Plan(ctx, c.raw)
	if err != nil {
		return p, err
	}
	return p, c.SetPlan(ctx, p)
}

// cloudHolds names what the cloud holds that an address plan shapes: its
// hosts (their agents run under the plan) and farms ("host h1", "farm
// blue"), the first few of each and how many more.
func (c *Controller) cloudHolds(ctx context.Context) ([]string, error) {
	var out []string
	for _, k := range []struct{ prefix, kind string }{{intent.HostsPrefix, "host"}, {intent.FarmsPrefix, "farm"}} {
		kvs, _, err := c.raw.List(ctx, k.prefix)
		if err != nil {
			return nil, err
		}
		var names []string
		for key := range kvs {
			names = append(names, k.kind+" "+strings.TrimPrefix(key, k.prefix))
		}
		sort.Strings(names)
		if len(names) > 5 {
			names = append(names[:5], fmt.Sprintf("%d more %ss", len(names)-5, k.kind))
		}
		out = append(out, names...)
	}
	return out, nil
}
