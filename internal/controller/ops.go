package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ipam"
	"github.com/onehop/onehop/internal/policy"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// Errors the API maps to HTTP statuses.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("already exists")
)

// FieldError says which input field is wrong and why.
type FieldError struct {
	Field string `json:"field"`
	Msg   string `json:"error"`
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Msg) }

func fieldErr(field string, err error) error { return &FieldError{Field: field, Msg: err.Error()} }

func notFound(format string, a ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, a...), ErrNotFound)
}

func conflict(format string, a ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, a...), ErrConflict)
}

func (c *Controller) alloc(ctx context.Context) (*ipam.Allocations, error) {
	var a ipam.Allocations
	if err := store.GetJSON(ctx, c.store, intent.AllocKey, &a); err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	return &a, nil
}

func (c *Controller) getFarm(ctx context.Context, name string) (intent.Farm, error) {
	var f intent.Farm
	err := store.GetJSON(ctx, c.store, intent.FarmsPrefix+name, &f)
	if errors.Is(err, store.ErrNotFound) {
		return f, notFound("farm %q", name)
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
		return intent.Farm{}, conflict("farm %q", name)
	}
	a, err := c.alloc(ctx)
	if err != nil {
		return intent.Farm{}, err
	}
	id, err := a.Farm(name)
	if err != nil {
		return intent.Farm{}, err
	}
	f := intent.Farm{Name: name, ID: id, ProxyARP: proxyARP}
	if err := store.PutJSON(ctx, c.store, intent.AllocKey, a); err != nil {
		return f, err
	}
	return f, store.PutJSON(ctx, c.store, intent.FarmsPrefix+name, f)
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
	key := intent.SubnetsPrefix + farm + "/" + name
	if _, err := c.store.Get(ctx, key); err == nil {
		return intent.Subnet{}, conflict("subnet %s/%s", farm, name)
	}
	a, err := c.alloc(ctx)
	if err != nil {
		return intent.Subnet{}, err
	}
	sid, err := a.Subnet(farm, name)
	if err != nil {
		return intent.Subnet{}, fieldErr("name", err)
	}
	s := intent.Subnet{Farm: farm, Name: name, ID: sid, Prefix: ipam.SubnetPrefix(f.ID, sid).String(), Gateway: ipam.Gateway(f.ID, sid).String()}
	if err := store.PutJSON(ctx, c.store, intent.AllocKey, a); err != nil {
		return s, err
	}
	return s, store.PutJSON(ctx, c.store, key, s)
}

// CreateVM places farm/subnet/name on host and allocates its address.
func (c *Controller) CreateVM(ctx context.Context, farm, subnet, name, host string) (intent.VM, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := topology.CheckVMName(name); err != nil {
		return intent.VM{}, fieldErr("name", err)
	}
	if _, err := c.store.Get(ctx, intent.SubnetsPrefix+farm+"/"+subnet); errors.Is(err, store.ErrNotFound) {
		return intent.VM{}, notFound("subnet %s/%s", farm, subnet)
	}
	if _, err := c.store.Get(ctx, intent.HostsPrefix+host); errors.Is(err, store.ErrNotFound) {
		return intent.VM{}, fieldErr("host", fmt.Errorf("no host %q", host))
	}
	vms, _, err := store.ListJSON[intent.VM](ctx, c.store, intent.VMsPrefix)
	if err != nil {
		return intent.VM{}, err
	}
	for _, v := range vms {
		// The vif is named after the VM, so the name is unique everywhere.
		if v.Name == name {
			return intent.VM{}, conflict("vm %q (as %s)", name, v.FullName())
		}
	}
	a, err := c.alloc(ctx)
	if err != nil {
		return intent.VM{}, err
	}
	ip, err := a.VM(farm, subnet, name)
	if err != nil {
		return intent.VM{}, fieldErr("subnet", err)
	}
	v := intent.NewVM(farm, subnet, name, host, ip)
	if err := store.PutJSON(ctx, c.store, intent.AllocKey, a); err != nil {
		return v, err
	}
	return v, store.PutJSON(ctx, c.store, intent.VMsPrefix+v.FullName(), v)
}

// DeleteVM removes a VM and frees its address.
func (c *Controller) DeleteVM(ctx context.Context, farm, subnet, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := intent.VMsPrefix + farm + "/" + subnet + "/" + name
	if _, err := c.store.Get(ctx, key); errors.Is(err, store.ErrNotFound) {
		return notFound("vm %s/%s/%s", farm, subnet, name)
	}
	a, err := c.alloc(ctx)
	if err != nil {
		return err
	}
	delete(a.VMs, farm+"/"+subnet+"/"+name)
	if err := store.PutJSON(ctx, c.store, intent.AllocKey, a); err != nil {
		return err
	}
	return c.store.Delete(ctx, key)
}

// qualify turns "web" into "farm/web" and checks the subnet exists.
func (c *Controller) qualify(ctx context.Context, farm, field, ref string) (string, error) {
	if !strings.Contains(ref, "/") {
		ref = farm + "/" + ref
	}
	if _, err := c.store.Get(ctx, intent.SubnetsPrefix+ref); errors.Is(err, store.ErrNotFound) {
		return "", fieldErr(field, fmt.Errorf("no subnet %q", ref))
	}
	return ref, nil
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
	p, err := policy.ProtoNumber(r.Proto)
	if err != nil {
		return r, fieldErr("proto", err)
	}
	if r.Port != 0 && p != 6 && p != 17 {
		return r, fieldErr("port", errors.New("a port needs proto tcp or udp"))
	}
	for _, have := range f.Rules {
		if have == r {
			return r, conflict("rule %s -> %s %s/%d", r.From, r.To, r.Proto, r.Port)
		}
	}
	f.Rules = append(f.Rules, r)
	return r, store.PutJSON(ctx, c.store, intent.FarmsPrefix+farm, f)
}

// Peer records that farm agrees to talk to other; traffic flows only once
// other peers back.
func (c *Controller) Peer(ctx context.Context, farm, other string) (mutual bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, err := c.getFarm(ctx, farm)
	if err != nil {
		return false, err
	}
	o, err := c.getFarm(ctx, other)
	if err != nil {
		return false, fieldErr("with", err)
	}
	if farm == other {
		return false, fieldErr("with", errors.New("a farm always talks to itself"))
	}
	has := func(list []string, s string) bool {
		for _, x := range list {
			if x == s {
				return true
			}
		}
		return false
	}
	if !has(f.Peers, other) {
		f.Peers = append(f.Peers, other)
		sort.Strings(f.Peers)
		if err := store.PutJSON(ctx, c.store, intent.FarmsPrefix+farm, f); err != nil {
			return false, err
		}
	}
	return has(o.Peers, farm), nil
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

// MoveVM records that a VM now runs on host. Its address and MAC stay; every
// host's mapping table follows from the recompiled desired state.
func (c *Controller) MoveVM(ctx context.Context, farm, subnet, name, host string) (intent.VM, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := intent.VMsPrefix + farm + "/" + subnet + "/" + name
	var v intent.VM
	if err := store.GetJSON(ctx, c.store, key, &v); errors.Is(err, store.ErrNotFound) {
		return v, notFound("vm %s/%s/%s", farm, subnet, name)
	} else if err != nil {
		return v, err
	}
	if _, err := c.store.Get(ctx, intent.HostsPrefix+host); errors.Is(err, store.ErrNotFound) {
		return v, fieldErr("host", fmt.Errorf("no host %q", host))
	}
	v.Host = host
	return v, store.PutJSON(ctx, c.store, key, v)
}
