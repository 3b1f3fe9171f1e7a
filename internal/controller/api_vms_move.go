package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// MoveVM records that a VM now runs on host. Without toSubnet its address
// and MAC stay; every host's mapping table follows from the recompiled
// desired state.
//
// With toSubnet (FARM/SUBNET, another subnet of the VM's farm) the VM also
// changes subnet, as a VM re-addressed after a move to another part of the
// data center does (issue 10, connection migration): it gets a new address
// in that subnet, and with it a new virtual MAC and gateway; its firewall
// goes with it. The record is the only thing written: the desired state
// (the new host's endpoint, its DHCP answer and anti-spoofing entries, the
// old host's loss of it) is compiled from it like any other change. Its old
// address is freed, but not handed out again while a live VNAT location
// record holds it (its connections still use it virtually, §3.4.2;
// location.go).
func (c *Controller) MoveVM(ctx context.Context, farm, subnet, name, host, toSubnet string) (intent.VM, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := intent.VMKey(farm, subnet, name)
	var v intent.VM
	if err := store.GetJSON(ctx, c.store, key, &v); errors.Is(err, store.ErrNotFound) {
		return v, notFound("vm", "vm %s/%s/%s", farm, subnet, name)
	} else if err != nil {
		return v, err
	}
	if _, err := c.store.Get(ctx, intent.HostsPrefix+host); errors.Is(err, store.ErrNotFound) {
		return v, fieldErr("host", fmt.Errorf("no host %q", host))
	}
	if toSubnet == "" {
		return c.moveHost(ctx, key, v, host)
	}
	tf, ts, err := parseSubnetRef(toSubnet)
	if err != nil {
		return v, err
	}
	_, err = c.store.Get(ctx, intent.SubnetKey(tf, ts))
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return v, err
	}
	exists := err == nil
	taps, _, err := store.ListJSON[intent.TapPolicy](ctx, c.store, intent.TapsPrefix)
	if err != nil {
		return v, err
	}
	if err := checkSubnetMove(v, tf, ts, exists, taps); err != nil {
		return v, err
	}
	if v.Host != host {
		if err := c.checkRoom(ctx, host); err != nil {
			return v, err
		}
		if err := c.checkInterfaceFree(ctx, host, v.Interface, v.FullName()); err != nil {
			return v, err
		}
	}
	a, err := c.allocIn(ctx, v.Farm+"/"+v.Subnet, tf+"/"+ts)
	if err != nil {
		return v, err
	}
	delete(a.VMs, v.FullName())
	held, err := c.heldAddrs(ctx)
	if err != nil {
		return v, err
	}
	ip, err := a.VMExcept(tf, ts, name, held)
	if err != nil {
		return v, allocErr("subnet", err)
	}
	moved := intent.NewVM(tf, ts, name, host, ip)
	moved.Firewall = v.Firewall
	moved.Interface = v.Interface // the guest keeps its interface's name
	moved.Floating = v.Floating   // its floating address goes with it (api_floating.go)
	if moved, err = c.withPublished(ctx, moved, v); err != nil {
		return v, err
	}
	// Its connections may keep the old address virtually: the location
	// server lets only this VM claim it (vmHolders).
	moved.Former = append(slices.DeleteFunc(slices.Clone(v.Former), func(a string) bool { return a == v.IP || a == ip.String() }), v.IP)
	if n := len(moved.Former); n > intent.MaxFormer {
		moved.Former = moved.Former[n-intent.MaxFormer:]
	}
	if host == v.Host {
		moved.Egress = v.Egress // a slice of the same host's address it may keep
	}
	eg, err := c.egressOf(ctx, tf, ts)
	if err != nil {
		return v, err
	}
	if err := c.checkEgressRoom(ctx, moved, eg); err != nil {
		return v, err
	}
	if err := c.saveAlloc(ctx, a, v.Farm+"/"+v.Subnet, tf+"/"+ts); err != nil {
		return v, err
	}
	// The old record goes first: for a moment the VM is nowhere rather
	// than twice (two records with one vif on one host would be a desired
	// state no agent can apply).
	if err := c.store.Delete(ctx, key); err != nil {
		return v, err
	}
	if moved, err = c.putVM(ctx, intent.VMsPrefix+moved.FullName(), moved, eg); err != nil {
		return v, err
	}
	if err := c.renameFloatingHolder(ctx, moved); err != nil {
		return moved, err
	}
	c.log.Info("vm moved to another subnet", "vm", name, "from", v.Farm+"/"+v.Subnet, "to", moved.Farm+"/"+moved.Subnet,
		"old_ip", v.IP, "ip", moved.IP, "host", host)
	return moved, nil
}

// moveHost is a move that keeps the VM's subnet and address.
func (c *Controller) moveHost(ctx context.Context, key string, v intent.VM, host string) (intent.VM, error) {
	if v.Host == host {
		return v, nil
	}
	if err := c.checkRoom(ctx, host); err != nil {
		return v, err
	}
	if err := c.checkInterfaceFree(ctx, host, v.Interface, v.FullName()); err != nil {
		return v, err
	}
	was := v
	v.Host = host
	// Its published ports follow it, leased on the new host's address
	// first: its slice, if any, is then given around them.
	var err error
	if v, err = c.withPublished(ctx, v, was); err != nil {
		return was, err
	}
	// A slice is a lease of the old host's address: the new host gives
	// another (connections through the old one do not survive a move,
	// docs/north-south.md).
	eg, err := c.egressOf(ctx, v.Farm, v.Subnet)
	if err != nil {
		return v, err
	}
	v.Egress = nil
	if err := c.checkEgressRoom(ctx, v, eg); err != nil {
		return v, err
	}
	return c.putVM(ctx, key, v, eg)
}

// parseSubnetRef splits FARM/SUBNET, the body's subnet field.
func parseSubnetRef(ref string) (farm, subnet string, err error) {
	farm, subnet, ok := strings.Cut(ref, "/")
	if !ok || strings.Contains(subnet, "/") {
		return "", "", fieldErr("subnet", fmt.Errorf("subnet %q must be FARM/SUBNET, e.g. blue/db", ref))
	}
	if err := topology.CheckFarmName(farm); err != nil {
		return "", "", fieldErr("subnet", err)
	}
	if err := topology.CheckSubnetName(subnet); err != nil {
		return "", "", fieldErr("subnet", err)
	}
	return farm, subnet, nil
}

// checkSubnetMove decides whether v may move to subnet farm/subnet (which
// exists or not), given the TAP policies there are. It is pure: MoveVM reads
// what it needs and asks.
//
// Refused: a subnet that does not exist; the VM's own subnet (a move to
// another host only leaves the subnet out, so saying it is a mistake the
// caller should hear about); a subnet of another farm, peered or not, since
// a farm is a tenant and its VMs, rules, peers and TAP policies are that
// tenant's: a VM changes owner by being made anew, not by a move; and a VM a
// TAP policy names as sender, receiver or monitor, since the policy would
// then name a VM that is not there any more (change or delete it first).
func checkSubnetMove(v intent.VM, farm, subnet string, exists bool, taps []intent.TapPolicy) error {
	to := farm + "/" + subnet
	switch {
	case farm != v.Farm:
		return fieldErr("subnet", fmt.Errorf("vm %s is in farm %s and cannot move to %s: a VM moves only within its farm (a farm is a tenant, peered or not)", v.FullName(), v.Farm, to))
	case subnet == v.Subnet:
		return &FieldError{Field: "subnet", kind: ErrConflict,
			Msg: fmt.Sprintf("vm %s is already in subnet %s: leave the subnet out to move it to another host only", v.FullName(), to)}
	case !exists:
		return fieldErr("subnet", fmt.Errorf("no subnet %q in farm %s", to, farm))
	}
	for _, p := range taps {
		for _, end := range []struct{ role, name string }{{"sender", p.Sender}, {"receiver", p.Receiver}, {"monitor", p.Monitor}} {
			if end.name == v.FullName() {
				return &FieldError{Field: "subnet", kind: ErrConflict,
					Msg: fmt.Sprintf("tap policy %q names vm %s as its %s: change or delete the policy before the VM moves to %s (it would name a VM no longer there)", p.Name, v.FullName(), end.role, to)}
			}
		}
	}
	return nil
}
