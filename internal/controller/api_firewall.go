package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/policy"
	"github.com/onehop/onehop/internal/store"
)

// firewallRoutes serves each VM's own firewall.
func (c *Controller) firewallRoutes(mux *router) {
	mux.HandleFunc("POST /v1/farms/{farm}/subnets/{subnet}/vms/{vm}/firewall", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			DefaultIn  string               `json:"defaultIn"`
			DefaultOut string               `json:"defaultOut"`
			Rule       *intent.FirewallRule `json:"rule"`
		}
		if decode(w, r, &in) {
			fw, err := c.AddFirewallRule(r.Context(), r.PathValue("farm"), r.PathValue("subnet"), r.PathValue("vm"), in.Rule, in.DefaultIn, in.DefaultOut)
			reply(w, http.StatusOK, fw, err)
		}
	})
	mux.HandleFunc("GET /v1/farms/{farm}/subnets/{subnet}/vms/{vm}/firewall", func(w http.ResponseWriter, r *http.Request) {
		fw, err := c.Firewall(r.Context(), r.PathValue("farm"), r.PathValue("subnet"), r.PathValue("vm"))
		reply(w, http.StatusOK, fw, err)
	})
	mux.HandleFunc("DELETE /v1/farms/{farm}/subnets/{subnet}/vms/{vm}/firewall/rules/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := ParseRuleID("id", r.PathValue("id"))
		var fw *intent.Firewall
		if err == nil {
			fw, err = c.DeleteFirewallRule(r.Context(), r.PathValue("farm"), r.PathValue("subnet"), r.PathValue("vm"), id)
		}
		reply(w, http.StatusOK, fw, err)
	})
}

// getFirewallVM reads VM farm/subnet/name, its firewall's rules numbered (a
// record of before rule ids gets them here, stored with its next write).
func (c *Controller) getFirewallVM(ctx context.Context, farm, subnet, name string) (intent.VM, error) {
	var v intent.VM
	if err := store.GetJSON(ctx, c.store, intent.VMKey(farm, subnet, name), &v); errors.Is(err, store.ErrNotFound) {
		return v, notFound("vm", "vm %s/%s/%s", farm, subnet, name)
	} else if err != nil {
		return v, err
	}
	v.Firewall = v.Firewall.NumberRules()
	return v, nil
}

// Firewall is a VM's own firewall, its rules with their ids; a VM without
// one has both defaults allow and no rule (what its datapath does).
func (c *Controller) Firewall(ctx context.Context, farm, subnet, name string) (*intent.Firewall, error) {
	v, err := c.getFirewallVM(ctx, farm, subnet, name)
	if err != nil {
		return nil, err
	}
	if v.Firewall == nil {
		return &intent.Firewall{DefaultIn: "allow", DefaultOut: "allow", Rules: []intent.FirewallRule{}}, nil
	}
	return v.Firewall, nil
}

// DeleteFirewallRule removes rule id from a VM's firewall and returns what
// is left. Removing an allow revokes what it admitted: the VM's host cuts
// established flows the firewall no longer admits at their next packet,
// and counts them as revoked (docs/virtual-router.md, "Revocation").
func (c *Controller) DeleteFirewallRule(ctx context.Context, farm, subnet, name string, id uint32) (*intent.Firewall, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, err := c.getFirewallVM(ctx, farm, subnet, name)
	if err != nil {
		return nil, err
	}
	i := -1
	if v.Firewall != nil {
		i = slices.IndexFunc(v.Firewall.Rules, func(r intent.FirewallRule) bool { return r.ID == id })
	}
	if i < 0 {
		return nil, notFound("id", "rule %d of %s's firewall", id, v.FullName())
	}
	v.Firewall.Rules = slices.Delete(v.Firewall.Rules, i, i+1)
	return v.Firewall, store.PutJSON(ctx, c.store, intent.VMKey(farm, subnet, name), v)
}

// AddFirewallRule appends a rule to a VM's own firewall, creating it (with
// both defaults allow) if the VM had none; defaults, when set, replace the
// current ones. The rule and defaults pass the same check as the CLI's
// (policy.NormalizeFirewallRule), which returns their stored form, so a rule
// that differs from an earlier one only in case is caught as a duplicate.
func (c *Controller) AddFirewallRule(ctx context.Context, farm, subnet, name string, r *intent.FirewallRule, defaultIn, defaultOut string) (*intent.Firewall, error) {
	var err error
	if defaultIn, err = policy.NormalizeAction("defaultIn", defaultIn, true); err != nil {
		return nil, policyErr("", err)
	}
	if defaultOut, err = policy.NormalizeAction("defaultOut", defaultOut, true); err != nil {
		return nil, policyErr("", err)
	}
	if r == nil && defaultIn == "" && defaultOut == "" {
		return nil, fieldErr("body", errors.New("nothing to add: give rule, defaultIn or defaultOut"))
	}
	var rule intent.FirewallRule
	if r != nil {
		if r.ID != 0 {
			return nil, fieldErr("rule.id", fmt.Errorf("id %d: the controller gives a rule its id; leave it out", r.ID))
		}
		if rule, err = policy.NormalizeFirewallRule(*r); err != nil {
			return nil, policyErr("rule.", err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	key := intent.VMKey(farm, subnet, name)
	v, err := c.getFirewallVM(ctx, farm, subnet, name)
	if err != nil {
		return nil, err
	}
	fw := &intent.Firewall{DefaultIn: "allow", DefaultOut: "allow"}
	if v.Firewall != nil {
		fw = v.Firewall // a copy: NumberRules copied the rules
	}
	if defaultIn != "" {
		fw.DefaultIn = defaultIn
	}
	if defaultOut != "" {
		fw.DefaultOut = defaultOut
	}
	if r != nil {
		for _, have := range fw.Rules {
			norm, err := policy.NormalizeFirewallRule(have)
			norm.ID = 0
			if err == nil && norm == rule {
				// First match wins: the copy could never match.
				return nil, conflict("rule", "the same rule as rule %d of %s's firewall", have.ID, name)
			}
		}
		fw.LastRuleID++
		rule.ID = fw.LastRuleID
		fw.Rules = append(fw.Rules, rule)
	}
	if err := policy.CheckFirewall(fw); err != nil {
		return nil, fieldErr("rule", err)
	}
	v.Firewall = fw
	return fw, store.PutJSON(ctx, c.store, key, v)
}

// normalizeFirewall returns fw with every default and rule in its stored
// form (as AddFirewallRule stores them), for firewalls from a topology file.
func normalizeFirewall(fw *intent.Firewall) (*intent.Firewall, error) {
	if fw == nil {
		return nil, nil
	}
	out := &intent.Firewall{Rules: make([]intent.FirewallRule, 0, len(fw.Rules))}
	var err error
	if out.DefaultIn, err = policy.NormalizeAction("default_in", fw.DefaultIn, false); err != nil {
		return nil, err
	}
	if out.DefaultOut, err = policy.NormalizeAction("default_out", fw.DefaultOut, false); err != nil {
		return nil, err
	}
	for i, r := range fw.Rules {
		n, err := policy.NormalizeFirewallRule(r)
		if err != nil {
			return nil, fmt.Errorf("firewall rule %d: %w", i+1, err)
		}
		out.Rules = append(out.Rules, n)
	}
	return out.NumberRules(), policy.CheckFirewall(out)
}
