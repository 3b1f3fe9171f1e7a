// Package controller is the only writer of intent: it turns a topology into
// farms, subnets and VMs with allocated 10.f.s.h addresses, and compiles the
// intent plus the agents' node reports into every host's desired state.
package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ipam"
	"github.com/onehop/onehop/internal/limits"
	"github.com/onehop/onehop/internal/policy"
	"github.com/onehop/onehop/internal/portspace"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/tap"
	"github.com/onehop/onehop/internal/topology"
)

// Controller compiles intent into desired state.
type Controller struct {
	store store.Store
	log   *slog.Logger
	mu    sync.Mutex // one intent change at a time: read, allocate, write
	// maxVMsPerHost is how many VMs a host's datapath holds; tests lower it.
	maxVMsPerHost int
	// maxSlivers is how many slivers a host's datapath holds
	// (portspace.MaxSlivers); tests lower it.
	maxSlivers int
	// maxTaps is how many TAP policies there may be: half a host's TAP
	// rules (tap.MaxRules), so each fits in both directions; tests lower it.
	maxTaps int
}

// New returns a controller writing to s.
func New(s store.Store, log *slog.Logger) *Controller {
	return &Controller{store: s, log: log, maxVMsPerHost: limits.MaxVMsPerHost, maxSlivers: portspace.MaxSlivers,
		maxTaps: tap.MaxRules / 2}
}

// ApplyTopology makes the intent in the store equal to the topology file:
// hosts, farms, subnets and VMs it names are created (keeping the addresses
// they already had), and those it no longer names are removed.
func (c *Controller) ApplyTopology(ctx context.Context, t *topology.File) error {
	var alloc ipam.Allocations
	if err := store.GetJSON(ctx, c.store, intent.AllocKey, &alloc); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	// Forget allocations of VMs the topology dropped so their ids free up.
	keep := map[string]bool{}
	for _, vm := range t.VMs {
		keep[vm.Subnet+"/"+vm.Name] = true
	}
	for k := range alloc.VMs {
		if !keep[k] {
			delete(alloc.VMs, k)
		}
	}

	want := map[string]any{}
	for _, h := range t.Hosts {
		want[intent.HostsPrefix+h.Name] = intent.Host{Name: h.Name, Address: h.Address}
	}
	for _, f := range t.Farms {
		fid, err := alloc.Farm(f.Name)
		if err != nil {
			return err
		}
		farm := intent.Farm{Name: f.Name, ID: fid, Peers: f.Peers, ProxyARP: f.ProxyARP}
		for _, r := range f.Rules {
			rule, err := policy.NormalizeRule(intent.Rule{From: f.Qualify(r.From), To: f.Qualify(r.To), Proto: r.Proto, Port: r.Port})
			if err != nil {
				return fmt.Errorf("farm %s: rule %s -> %s: %w", f.Name, r.From, r.To, err)
			}
			farm.Rules = append(farm.Rules, rule)
		}
		want[intent.FarmsPrefix+f.Name] = farm
		for _, s := range f.Subnets {
			sid, err := alloc.Subnet(f.Name, s.Name)
			if err != nil {
				return err
			}
			want[intent.SubnetsPrefix+f.Name+"/"+s.Name] = intent.Subnet{
				Farm: f.Name, Name: s.Name, ID: sid,
				Prefix: ipam.SubnetPrefix(fid, sid).String(), Gateway: ipam.Gateway(fid, sid).String(),
			}
		}
	}
	held, err := c.heldAddrs(ctx)
	if err != nil {
		return err
	}
	perHost := map[string]int{}
	for _, vm := range t.VMs {
		ip, err := alloc.VMExcept(vm.Farm(), vm.SubnetName(), vm.Name, held)
		if err != nil {
			return err
		}
		if perHost[vm.Host]++; perHost[vm.Host] > c.maxVMsPerHost {
			return fmt.Errorf("vm %s: host %q would hold more VMs than its datapath holds (%d)", vm.Name, vm.Host, c.maxVMsPerHost)
		}
		v := intent.NewVM(vm.Farm(), vm.SubnetName(), vm.Name, vm.Host, ip)
		if v.Firewall, err = normalizeFirewall(vm.Firewall); err != nil {
			return fmt.Errorf("vm %s: %w", vm.Name, err)
		}
		want[intent.VMsPrefix+v.FullName()] = v
	}
	if err := store.PutJSON(ctx, c.store, intent.AllocKey, alloc); err != nil {
		return err
	}
	if err := c.putExactly(ctx, want); err != nil {
		return err
	}
	seeds, uplinks := topologySlivers(t)
	if err := c.applySlivers(ctx, t.Path, seeds, uplinks); err != nil {
		return err
	}
	if err := c.applyTaps(ctx, t.Path, topologyTaps(t)); err != nil {
		return err
	}
	c.log.Info("topology applied", "file", t.Path, "hosts", len(t.Hosts), "farms", len(t.Farms), "vms", len(t.VMs))
	return nil
}

// putExactly makes the intent prefixes hold exactly want: keys it lacks are
// deleted, the others written where they changed, in key order.
func (c *Controller) putExactly(ctx context.Context, want map[string]any) error {
	for _, prefix := range []string{intent.HostsPrefix, intent.FarmsPrefix, intent.SubnetsPrefix, intent.VMsPrefix} {
		have, _, err := c.store.List(ctx, prefix)
		if err != nil {
			return err
		}
		for k := range have {
			if _, ok := want[k]; !ok {
				if err := c.store.Delete(ctx, k); err != nil {
					return err
				}
			}
		}
	}
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := putIfChanged(ctx, c.store, k, want[k]); err != nil {
			return err
		}
	}
	return nil
}

func putIfChanged(ctx context.Context, s store.Store, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", key, err)
	}
	if cur, err := s.Get(ctx, key); err == nil && string(cur) == string(b) {
		return nil
	}
	return s.Put(ctx, key, b)
}

// CompileOnce writes every host's desired state from the current intent and
// node reports, and returns the revision it read.
func (c *Controller) CompileOnce(ctx context.Context) (int64, error) {
	hosts, rev, err := store.ListJSON[intent.Host](ctx, c.store, intent.HostsPrefix)
	if err != nil {
		return 0, err
	}
	vms, rev2, err := store.ListJSON[intent.VM](ctx, c.store, intent.VMsPrefix)
	if err != nil {
		return 0, err
	}
	nodes, rev3, err := store.ListJSON[intent.Node](ctx, c.store, intent.NodesPrefix)
	if err != nil {
		return 0, err
	}
	farms, rev4, err := store.ListJSON[intent.Farm](ctx, c.store, intent.FarmsPrefix)
	if err != nil {
		return 0, err
	}
	subnets, rev5, err := store.ListJSON[intent.Subnet](ctx, c.store, intent.SubnetsPrefix)
	if err != nil {
		return 0, err
	}
	slivers, rev6, err := store.ListJSON[intent.Sliver](ctx, c.store, intent.SliversPrefix)
	if err != nil {
		return 0, err
	}
	taps, rev7, err := store.ListJSON[intent.TapPolicy](ctx, c.store, intent.TapsPrefix)
	if err != nil {
		return 0, err
	}
	rev = min(rev, rev2, rev3, rev4, rev5, rev6, rev7)
	desired, pending := policy.Compile(policy.State{Hosts: hosts, Farms: farms, Subnets: subnets, VMs: vms, Nodes: nodes, Slivers: slivers, Taps: taps})
	for host, d := range desired {
		if err := putIfChanged(ctx, c.store, intent.DesiredPrefix+host, d); err != nil {
			return rev, err
		}
	}
	existing, _, err := c.store.List(ctx, intent.DesiredPrefix)
	if err != nil {
		return rev, err
	}
	for k := range existing {
		if _, ok := desired[k[len(intent.DesiredPrefix):]]; !ok {
			if err := c.store.Delete(ctx, k); err != nil {
				return rev, err
			}
		}
	}
	if len(pending) > 0 {
		c.log.Debug("VMs not yet reachable from other hosts", "vms", pending)
	}
	return rev, nil
}

// Run recompiles whenever intent or a node report changes, until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	resync := time.NewTicker(10 * time.Second)
	defer resync.Stop()
	for {
		rev, err := c.CompileOnce(ctx)
		if err != nil {
			c.log.Error("compile desired state", "err", err)
		}
		wctx, cancel := context.WithCancel(ctx)
		intentCh := c.store.Watch(wctx, intent.Root+"intent/", rev)
		nodesCh := c.store.Watch(wctx, intent.NodesPrefix, rev)
		select {
		case <-ctx.Done():
			cancel()
			return nil
		case <-intentCh:
		case <-nodesCh:
		case <-resync.C:
		}
		cancel()
	}
}
