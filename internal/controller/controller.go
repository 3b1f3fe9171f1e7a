// Package controller is the only writer of intent: it turns a topology into
// farms, subnets and VMs with allocated 10.f.s.h addresses, and compiles the
// intent plus the agents' node reports into every host's desired state.
package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/egressspec"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ipam"
	"github.com/onehop/onehop/internal/limits"
	"github.com/onehop/onehop/internal/policy"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// Controller compiles intent into desired state.
type Controller struct {
	// store is raw with every write of intent tracked: applied to the
	// model and compiled into the desired keys it changes (tracked.go).
	store store.Store
	raw   store.Store
	model model
	// kick asks Run for a full compile: a desired write failed.
	kick chan struct{}
	// maint keeps the store small and reports on it; nil for a store
	// that is not etcd.
	maint *StoreMaintainer
	log   *slog.Logger
	mu    sync.Mutex // one intent change at a time: read, allocate, write
	// maxVMsPerHost is how many VMs a host's datapath holds; tests lower it.
	maxVMsPerHost int
	// maxSlivers is how many slivers a host's datapath holds
	// (limits.MaxSlivers); tests lower it.
	maxSlivers int
	// maxTaps is how many TAP policies there may be: half a host's TAP
	// rules (limits.MaxTapRules), so each fits in both directions; tests lower it.
	maxTaps int
	// loc is the location server's held-address index (location.go).
	loc locationState
	// listeners counts the API's and the location server's listeners
	// (onehop_listener_* on /metrics).
	listeners *accept.Stats
	// auth keeps a user per host agent in etcd (etcdauth.go); nil
	// without etcd auth.
	auth *etcdAuth
	// tokens is the copy of the tenant tokens every request is checked
	// against (api_tenants.go); audit, the audit trail (api_audit.go).
	tokens tenantTokens
	// certRevs: the revoked tenant certificates (api_certs.go).
	certRevs certRevocations
	audit    auditLog
}

// New returns a controller writing to s.
func New(s store.Store, log *slog.Logger) *Controller {
	c := &Controller{raw: s, log: log, maxVMsPerHost: limits.MaxVMsPerHost, maxSlivers: limits.MaxSlivers,
		maxTaps: limits.MaxTapRules / 2, kick: make(chan struct{}, 1), listeners: accept.NewStats(nil)}
	c.store = &tracked{Store: s, c: c}
	c.audit.keep = DefaultAuditKeep
	return c
}

// ApplyTopology makes the intent in the store equal to the topology file:
// hosts, farms, subnets and VMs it names are created (keeping the addresses
// they already had), and those it no longer names are removed.
func (c *Controller) ApplyTopology(ctx context.Context, t *topology.File) error {
	a, err := c.alloc(ctx)
	if err != nil {
		return err
	}
	alloc := *a
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
		if f.Egress != nil {
			if farm.Egress, err = egressspec.Farm(*f.Egress); err != nil {
				return fmt.Errorf("farm %s: egress: %w", f.Name, err)
			}
		}
		for _, r := range f.Rules {
			rule, err := policy.NormalizeRule(intent.Rule{From: f.Qualify(r.From), To: f.Qualify(r.To), Proto: r.Proto, Port: r.Port})
			if err != nil {
				return fmt.Errorf("farm %s: rule %s -> %s: %w", f.Name, r.From, r.To, err)
			}
			farm.Rules = append(farm.Rules, rule)
		}
		if farm, err = c.keepRuleIDs(ctx, farm); err != nil {
			return err
		}
		want[intent.FarmsPrefix+f.Name] = farm
		for _, s := range f.Subnets {
			sid, err := alloc.Subnet(f.Name, s.Name)
			if err != nil {
				return err
			}
			sub := intent.Subnet{
				Farm: f.Name, Name: s.Name, ID: sid,
				Prefix: ipam.SubnetPrefix(fid, sid).String(), Gateway: ipam.Gateway(fid, sid).String(),
			}
			if s.Egress != nil {
				if sub.Egress, err = egressspec.Subnet(*s.Egress); err != nil {
					return fmt.Errorf("subnet %s/%s: egress: %w", f.Name, s.Name, err)
				}
			}
			want[intent.SubnetKey(f.Name, s.Name)] = sub
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
		v.Interface = vm.Vif()
		// Its slice, while it has one on this host: SetFarmEgress below
		// gives and takes slices; a rewrite here would churn them.
		var had intent.VM
		if err := store.GetJSON(ctx, c.store, intent.VMsPrefix+v.FullName(), &had); err == nil && had.Host == v.Host {
			v.Egress = had.Egress
			v.Published = had.Published // the API's, not the file's: kept while the VM stays on its host
		}
		// Its floating address is the operator's, attached by hand, not
		// the topology's: it stays wherever the VM goes.
		v.Floating = had.Floating
		if v.Firewall, err = normalizeFirewall(vm.Firewall); err != nil {
			return fmt.Errorf("vm %s: %w", vm.Name, err)
		}
		want[intent.VMsPrefix+v.FullName()] = v
	}
	if err := c.saveAlloc(ctx, &alloc); err != nil {
		return err
	}
	if err := c.putExactly(ctx, want); err != nil {
		return err
	}
	seeds, uplinks := topologySlivers(t)
	if err := c.applySlivers(ctx, t.Path, seeds, uplinks); err != nil {
		return err
	}
	// After the slivers: a VM's slice is leased beside their ports.
	for _, f := range t.Farms {
		s := egressspec.Setting{}
		if f.Egress != nil {
			s = *f.Egress
		}
		if _, err := c.SetFarmEgress(ctx, f.Name, s); err != nil {
			return fmt.Errorf("farm %s: egress: %w", f.Name, err)
		}
	}
	if err := c.applyTaps(ctx, t.Path, topologyTaps(t), fileFabric(t)); err != nil {
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

// CompileOnce reloads the intent and every desired key from the store and
// writes the desired keys that differ from what the intent makes (deleting
// those it does not make), and returns the revision it read at. Nothing is
// written when the store already agrees: a restarted controller costs the
// agents nothing. Every change the controller makes itself is compiled as
// it is made (tracked.go); this full pass runs at start, after a failed
// write, and every few minutes to catch what was written behind its back.
func (c *Controller) CompileOnce(ctx context.Context) (int64, error) {
	m := &c.model
	m.mu.Lock()
	defer m.mu.Unlock()
	return c.compileAllLocked(ctx)
}

// compileAllLocked is CompileOnce with c.model.mu held.
func (c *Controller) compileAllLocked(ctx context.Context) (int64, error) {
	m := &c.model
	rev, err := m.load(ctx, c.raw)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	writes, err := m.compileAll(ctx, c.raw)
	if err != nil {
		m.loaded = false
		return rev, fmt.Errorf("write desired state: %w", err)
	}
	c.log.Info("desired state compiled in full", "hosts", len(m.hosts), "vms", len(m.vms), "keys_written", writes,
		"took", time.Since(start).Round(time.Microsecond))
	return rev, nil
}

// fullResync is how often Run compiles in full even when nothing failed.
const fullResync = 5 * time.Minute

// Run compiles the desired state in full at start, again after any failed
// write of it (every second until one succeeds) and every few minutes,
// until ctx ends. Changes in between are compiled as they are made.
func (c *Controller) Run(ctx context.Context) error {
	resync := time.NewTicker(fullResync)
	defer resync.Stop()
	for {
		wait := (<-chan time.Time)(nil)
		if _, err := c.CompileOnce(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			c.log.Error("compile desired state; retrying in 1s", "err", err)
			wait = time.After(time.Second)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.kick:
		case <-wait:
		case <-resync.C:
		}
	}
}
