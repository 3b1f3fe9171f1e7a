package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/policy"
	"github.com/onehop/onehop/internal/store"
)

// ruleRoutes serves visibility rules between subnets.
func (c *Controller) ruleRoutes(mux *router) {
	mux.HandleFunc("GET /v1/rules", c.rules)
	mux.HandleFunc("POST /v1/farms/{farm}/rules", func(w http.ResponseWriter, r *http.Request) {
		var in intent.Rule
		if decode(w, r, &in) {
			out, err := c.Allow(r.Context(), r.PathValue("farm"), in)
			reply(w, http.StatusCreated, out, err)
		}
	})
}

// RuleView is a rule with its owner and whether it is in force.
type RuleView struct {
	Farm string `json:"farm"`
	intent.Rule
	Effective bool `json:"effective"` // within a farm always; across farms once both peer and allow
}

func (c *Controller) rules(w http.ResponseWriter, r *http.Request) {
	views, err := c.Rules(r.Context())
	// A tenant sees its own farm's rules (scopeOwnFarm).
	if farm := ownFarm(r.Context()); farm != "" {
		views = slices.DeleteFunc(views, func(v RuleView) bool { return v.Farm != farm })
	}
	reply(w, http.StatusOK, views, err)
}

// Rules lists every farm's rules and whether each is in force.
func (c *Controller) Rules(ctx context.Context) ([]RuleView, error) {
	farms, _, err := store.ListJSON[intent.Farm](ctx, c.store, intent.FarmsPrefix)
	if err != nil {
		return nil, err
	}
	subnets, _, err := store.ListJSON[intent.Subnet](ctx, c.store, intent.SubnetsPrefix)
	if err != nil {
		return nil, err
	}
	sort.Slice(farms, func(i, j int) bool { return farms[i].Name < farms[j].Name })
	effective := map[string]bool{}
	ids := map[string]intent.Subnet{}
	farmIDs := map[string]uint8{}
	for _, f := range farms {
		farmIDs[f.Name] = f.ID
	}
	for _, s := range subnets {
		ids[s.Farm+"/"+s.Name] = s
	}
	for _, v := range policy.Visibility(farms, subnets) {
		effective[fmt.Sprint(v.SrcFarm, v.SrcSubnet, v.DstFarm, v.DstSubnet)] = true
	}
	views := []RuleView{}
	for _, f := range farms {
		for _, rule := range f.Rules {
			from, to := ids[rule.From], ids[rule.To]
			key := fmt.Sprint(farmIDs[from.Farm], from.ID, farmIDs[to.Farm], to.ID)
			views = append(views, RuleView{Farm: f.Name, Rule: rule, Effective: effective[key]})
		}
	}
	return views, nil
}

// Allow adds a rule of farm's owner letting from reach to. Within the farm
// it takes effect at once; across farms only once both peer and allow.
func (c *Controller) Allow(ctx context.Context, farm string, r intent.Rule) (intent.Rule, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, err := c.getFarm(ctx, farm)
	if err != nil {
		return r, err
	}
	if r.From, err = c.qualify(ctx, farm, "from", r.From); err != nil {
		return r, err
	}
	if r.To, err = c.qualify(ctx, farm, "to", r.To); err != nil {
		return r, err
	}
	if r.From == r.To {
		return r, fieldErr("to", errors.New("same subnet as from; a subnet is always open inside"))
	}
	if !strings.HasPrefix(r.From, farm+"/") && !strings.HasPrefix(r.To, farm+"/") {
		return r, fieldErr("from", fmt.Errorf("neither %s nor %s belongs to farm %s", r.From, r.To, farm))
	}
	// The same check as the CLI's; it returns the stored form ("TCP" and
	// "tcp", "any" and "" are one proto), so a duplicate is caught.
	if r, err = policy.NormalizeRule(r); err != nil {
		return r, policyErr("", err)
	}
	for i, have := range f.Rules {
		if norm, err := policy.NormalizeRule(have); err == nil && norm == r {
			return r, conflict("body", "rule %s -> %s %s (farm %s's rule %d)", r.From, r.To, ruleWhat(r), farm, i+1)
		}
	}
	f.Rules = append(f.Rules, r)
	return r, store.PutJSON(ctx, c.store, intent.FarmsPrefix+farm, f)
}

// ruleWhat is a rule's protocol and port as people write them: any, tcp/80.
func ruleWhat(r intent.Rule) string {
	p := r.Proto
	if p == "" {
		p = "any"
	}
	if r.Port == 0 {
		return p
	}
	return fmt.Sprintf("%s/%d", p, r.Port)
}
