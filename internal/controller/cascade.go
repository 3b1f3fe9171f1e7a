package controller

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// boolQuery reads the query parameter name of r: absent or false is
// false, true is true, anything else a bad value naming it (400).
func boolQuery(r *http.Request, name string) (bool, error) {
	switch v := r.URL.Query().Get(name); v {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	default:
		return false, fieldErr(name, fmt.Errorf("%s=%q: want true or false", name, v))
	}
}

// pathChecks are the name checks of the path parameters: a malformed name
// is a bad value (400) naming the parameter, not an object that is not
// there (404).
var pathChecks = map[string]func(string) error{
	"farm":   topology.CheckFarmName,
	"subnet": topology.CheckSubnetName,
	"vm":     topology.CheckVMName,
	"host":   topology.CheckHostName,
}

// checkPath checks r's path parameters named, in order.
func checkPath(r *http.Request, params ...string) error {
	for _, p := range params {
		if err := pathChecks[p](r.PathValue(p)); err != nil {
			return fieldErr(p, err)
		}
	}
	return nil
}

// deletion is what a delete removes: a whole farm (subnet ""), or one subnet.
type deletion struct{ farm, subnet string }

func (s deletion) String() string {
	if s.subnet == "" {
		return "farm " + s.farm
	}
	return "subnet " + s.farm + "/" + s.subnet
}

// holds reports whether ref (FARM, FARM/SUBNET or FARM/SUBNET/VM, as
// rules and TAP policies name things) is in s.
func (s deletion) holds(ref string) bool {
	p := s.farm
	if s.subnet != "" {
		p += "/" + s.subnet
	}
	return ref == p || strings.HasPrefix(ref, p+"/")
}

// dependants is what refers to what a deletion removes from outside it, and what it
// holds: what a delete of it would leave dangling, and what a cascade
// deletes first.
type dependants struct {
	subnets []string // FARM/SUBNET, of a farm
	vms     []string // FARM/SUBNET/VM
	taps    []string // TAP policies naming a VM or subnet of it, or one of its subnets' segments (vlan)
	// rules are the rules of other farms (and, for a subnet, of its own)
	// that name a subnet of it, by the farm holding them.
	rules map[string][]intent.Rule
	peers []string // farms peering with the farm
}

func (d *dependants) empty() bool {
	return len(d.subnets)+len(d.vms)+len(d.taps)+len(d.rules)+len(d.peers) == 0
}

// names lists the dependants as the 409 names them: "KIND NAME" each.
func (d *dependants) names() []string {
	var out []string
	for _, s := range d.subnets {
		out = append(out, "subnet "+s)
	}
	for _, v := range d.vms {
		out = append(out, "vm "+v)
	}
	for _, f := range sortedKeys(d.rules) {
		for _, r := range d.rules[f] {
			out = append(out, fmt.Sprintf("rule of farm %s: %s -> %s %s", f, r.From, r.To, ruleWhat(r)))
		}
	}
	for _, f := range d.peers {
		out = append(out, "peering of farm "+f)
	}
	for _, t := range d.taps {
		out = append(out, "tap "+t)
	}
	return out
}

// dependantsOf reads what depends on s. c.mu is held.
func (c *Controller) dependantsOf(ctx context.Context, s deletion) (*dependants, error) {
	farms, _, err := store.ListJSON[intent.Farm](ctx, c.store, intent.FarmsPrefix)
	if err != nil {
		return nil, err
	}
	subnets, _, err := store.ListJSON[intent.Subnet](ctx, c.store, intent.SubnetsPrefix)
	if err != nil {
		return nil, err
	}
	vms, _, err := store.ListJSON[intent.VM](ctx, c.store, intent.VMsPrefix+s.farm+"/")
	if err != nil {
		return nil, err
	}
	taps, _, err := store.ListJSON[intent.TapPolicy](ctx, c.store, intent.TapsPrefix)
	if err != nil {
		return nil, err
	}
	d := &dependants{rules: map[string][]intent.Rule{}}
	var fid uint16
	for _, f := range farms {
		if f.Name == s.farm {
			fid = uint16(f.ID)
		}
	}
	// A TAP policy's vlan is a subnet's segment, farm id * 256 + subnet id
	// (docs/tap.md): a new subnet that took the id would be copied.
	segments := map[uint16]bool{}
	for _, sub := range subnets {
		if full := sub.Farm + "/" + sub.Name; s.holds(full) {
			segments[fid*256+uint16(sub.ID)] = true
			if s.subnet == "" {
				d.subnets = append(d.subnets, full)
			}
		}
	}
	for _, v := range vms {
		if s.holds(v.FullName()) {
			d.vms = append(d.vms, v.FullName())
		}
	}
	for _, f := range farms {
		if f.Name == s.farm && s.subnet == "" {
			continue // its own rules and peerings go with its record
		}
		for _, r := range f.Rules {
			if s.holds(r.From) || s.holds(r.To) {
				d.rules[f.Name] = append(d.rules[f.Name], r)
			}
		}
		if s.subnet == "" && slices.Contains(f.Peers, s.farm) {
			d.peers = append(d.peers, f.Name)
		}
	}
	for _, p := range taps {
		if s.holds(p.Sender) || s.holds(p.Receiver) || s.holds(p.Monitor) || (p.VLAN != 0 && segments[p.VLAN]) {
			d.taps = append(d.taps, p.Name)
		}
	}
	slices.Sort(d.subnets)
	slices.Sort(d.vms)
	slices.Sort(d.taps)
	slices.Sort(d.peers)
	return d, nil
}

// refuseOrCascade refuses the delete of s while anything depends on it
// (409 naming each), or with cascade deletes them first, in an order that
// never leaves a reference to what is gone: the TAP policies that name
// its VMs and subnets, the rules and peerings of other farms that name it,
// its VMs, and (of a farm) its subnets. Each goes as its own delete does,
// its ids freed. c.mu is held.
func (c *Controller) refuseOrCascade(ctx context.Context, s deletion, cascade bool) error {
	d, err := c.dependantsOf(ctx, s)
	if err != nil || d.empty() {
		return err
	}
	field := "farm"
	if s.subnet != "" {
		field = "subnet"
	}
	if !cascade {
		return inUse(field, s.String(), d.names())
	}
	for _, t := range d.taps {
		if err := c.store.Delete(ctx, tapKey(t)); err != nil {
			return fmt.Errorf("cascade %s: tap %s: %w", s, t, err)
		}
	}
	others := slices.Clone(d.peers)
	for f := range d.rules {
		if !slices.Contains(others, f) {
			others = append(others, f)
		}
	}
	slices.Sort(others)
	for _, name := range others {
		f, err := c.getFarm(ctx, name)
		if err != nil {
			return fmt.Errorf("cascade %s: farm %s: %w", s, name, err)
		}
		f.Rules = slices.DeleteFunc(f.Rules, func(r intent.Rule) bool { return s.holds(r.From) || s.holds(r.To) })
		if s.subnet == "" {
			f.Peers = slices.DeleteFunc(f.Peers, func(p string) bool { return p == s.farm })
		}
		if err := store.PutJSON(ctx, c.store, intent.FarmsPrefix+name, f); err != nil {
			return fmt.Errorf("cascade %s: farm %s: %w", s, name, err)
		}
	}
	for _, full := range d.vms {
		p := strings.SplitN(full, "/", 3)
		if err := c.deleteVMLocked(ctx, p[0], p[1], p[2]); err != nil {
			return fmt.Errorf("cascade %s: vm %s: %w", s, full, err)
		}
	}
	for _, full := range d.subnets {
		farm, sub, _ := strings.Cut(full, "/")
		if err := c.dropSubnet(ctx, farm, sub); err != nil {
			return fmt.Errorf("cascade %s: subnet %s: %w", s, full, err)
		}
	}
	return nil
}
