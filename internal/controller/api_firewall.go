package controller

import (
	"context"
	"errors"
	"net/http"
	"net/netip"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/policy"
	"github.com/onehop/onehop/internal/store"
)

// firewallRoutes serves each VM's own firewall.
func (c *Controller) firewallRoutes(mux *http.ServeMux) {
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
// current ones.
func (c *Controller) AddFirewallRule(ctx context.Context, farm, subnet, name string, r *intent.FirewallRule, defaultIn, defaultOut string) (*intent.Firewall, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := intent.VMsPrefix + farm + "/" + subnet + "/" + name
	var v intent.VM
	if err := store.GetJSON(ctx, c.store, key, &v); errors.Is(err, store.ErrNotFound) {
		return nil, notFound("vm %s/%s/%s", farm, subnet, name)
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
		if r.CIDR != "" {
			if p, err := netip.ParsePrefix(r.CIDR); err == nil {
				r.CIDR = p.Masked().String()
			}
		}
		fw.Rules = append(fw.Rules, *r)
	}
	if err := policy.CheckFirewall(fw); err != nil {
		return nil, fieldErr("firewall", err)
	}
	v.Firewall = fw
	return fw, store.PutJSON(ctx, c.store, key, v)
}
