package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"

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
		if rule, err = policy.NormalizeFirewallRule(*r); err != nil {
			return nil, policyErr("rule.", err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	key := intent.VMKey(farm, subnet, name)
	var v intent.VM
	if err := store.GetJSON(ctx, c.store, key, &v); errors.Is(err, store.ErrNotFound) {
		return nil, notFound("vm", "vm %s/%s/%s", farm, subnet, name)
	} else if err != nil {
		return nil, err
	}
	fw := &intent.Firewall{DefaultIn: "allow", DefaultOut: "allow"}
	if v.Firewall != nil {
		cp := *v.Firewall
		cp.Rules = append([]intent.FirewallRule(nil), v.Firewall.Rules...)
		fw = &cp
	}
	if defaultIn != "" {
		fw.DefaultIn = defaultIn
	}
	if defaultOut != "" {
		fw.DefaultOut = defaultOut
	}
	if r != nil {
		for i, have := range fw.Rules {
			if norm, err := policy.NormalizeFirewallRule(have); err == nil && norm == rule {
				// First match wins: the copy could never match.
				return nil, conflict("rule", "the same rule as rule %d of %s's firewall", i+1, name)
			}
		}
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
	return out, policy.CheckFirewall(out)
}
