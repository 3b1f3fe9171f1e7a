package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
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
	mux.HandleFunc("GET /v1/farms/{farm}/rules", func(w http.ResponseWriter, r *http.Request) {
		views, err := c.FarmRules(r.Context(), r.PathValue("farm"))
		reply(w, http.StatusOK, views, err)
	})
	mux.HandleFunc("GET /v1/farms/{farm}/rules/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := ParseRuleID("id", r.PathValue("id"))
		var v RuleView
		if err == nil {
			v, err = c.GetRule(r.Context(), r.PathValue("farm"), id)
		}
		reply(w, http.StatusOK, v, err)
	})
	mux.HandleFunc("DELETE /v1/farms/{farm}/rules/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := ParseRuleID("id", r.PathValue("id"))
		if err == nil {
			err = c.DeleteRule(r.Context(), r.PathValue("farm"), id)
		}
		reply(w, http.StatusNoContent, nil, err)
	})
}

// ParseRuleID reads a rule's id (a visibility rule's or a firewall
// rule's) from a path or an argument: a positive decimal number. The error
// names field.
func ParseRuleID(field, s string) (uint32, error) {
	id, err := strconv.ParseUint(s, 10, 32)
	if err != nil || id == 0 {
		return 0, fieldErr(field, fmt.Errorf("rule id %q: want a positive number, as `rule list` shows it", s))
	}
	return uint32(id), nil
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
	return c.ruleViews(ctx, "")
}

// FarmRules lists the rules farm owns and whether each is in force.
func (c *Controller) FarmRules(ctx context.Context, farm string) ([]RuleView, error) {
	if _, err := c.getFarm(ctx, farm); err != nil {
		return nil, err
	}
	return c.ruleViews(ctx, farm)
}

// GetRule is rule id of farm and whether it is in force.
func (c *Controller) GetRule(ctx context.Context, farm string, id uint32) (RuleView, error) {
	views, err := c.FarmRules(ctx, farm)
	if err != nil {
		return RuleView{}, err
	}
	for _, v := range views {
		if v.ID == id {
			return v, nil
		}
	}
	return RuleView{}, notFound("id", "rule %d of farm %s", id, farm)
}

// DeleteRule removes rule id of farm. What it alone allowed stops at
// once on every host: new flows are refused, and each host's datapath cuts
// the established flows it admitted at their next packet and counts them
// as revoked (docs/virtual-router.md, "Revocation").
func (c *Controller) DeleteRule(ctx context.Context, farm string, id uint32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, err := c.getFarm(ctx, farm)
	if err != nil {
		return err
	}
	f = f.NumberRules()
	i := slices.IndexFunc(f.Rules, func(r intent.Rule) bool { return r.ID == id })
	if i < 0 {
		return notFound("id", "rule %d of farm %s", id, farm)
	}
	f.Rules = slices.Delete(f.Rules, i, i+1)
	return store.PutJSON(ctx, c.store, intent.FarmsPrefix+farm, f)
}

// ruleViews lists the rules of farm ("" every farm's), by farm and id.
func (c *Controller) ruleViews(ctx context.Context, farm string) ([]RuleView, error) {
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
	farmIDs := map[string]uint16{}
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
		if farm != "" && f.Name != farm {
			continue
		}
		for _, rule := range f.NumberRules().Rules {
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
	if r.ID != 0 {
		return r, fieldErr("id", fmt.Errorf("id %d: the controller gives a rule its id; leave it out", r.ID))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	f, err := c.getFarm(ctx, farm)
	if err != nil {
		return r, err
	}
	f = f.NumberRules() // a record of before rule ids gets them, stored with this write
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
	for _, have := range f.Rules {
		norm, err := policy.NormalizeRule(have)
		norm.ID = 0
		if err == nil && norm == r {
			return r, conflict("body", "rule %s -> %s %s (farm %s's rule %d)", r.From, r.To, ruleWhat(r), farm, have.ID)
		}
	}
	f.LastRuleID++
	r.ID = f.LastRuleID
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

// keepRuleIDs numbers the rules of farm f as a topology file gives them:
// a rule the stored farm already holds keeps its id (applying the file
// again renames nothing), a new one gets the next.
func (c *Controller) keepRuleIDs(ctx context.Context, f intent.Farm) (intent.Farm, error) {
	have, err := c.getFarm(ctx, f.Name)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return f, err
	}
	have = have.NumberRules()
	f.LastRuleID = have.LastRuleID
	taken := map[uint32]bool{}
	for i, r := range f.Rules {
		for _, h := range have.Rules {
			id := h.ID
			h.ID = 0
			if norm, err := policy.NormalizeRule(h); err == nil && norm == r && !taken[id] {
				f.Rules[i].ID, taken[id] = id, true
				break
			}
		}
	}
	return f.NumberRules(), nil
}
