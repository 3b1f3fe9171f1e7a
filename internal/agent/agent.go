// Package agent is the per-host daemon: it reports its host's uplink, watches
// the host's desired state in the store, and keeps the datapath equal to it.
// Reconciling is level-triggered: every pass computes the full map content
// from the full desired state, so a restarted agent converges on the same
// maps without touching flows that are already right.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"sort"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// Datapath is what the agent needs from the kernel datapath; the real one is
// *datapath.Kernel, tests use a fake.
type Datapath interface {
	AttachUplink(name string, ifindex int) error
	Apply(e datapath.Entries, uplinkName string) error
	Counters() (datapath.Counters, error)
}

// Interfaces looks up the host's network interfaces.
type Interfaces interface {
	// ByName returns ifindex, MAC and the first IPv4 address (may be empty).
	ByName(name string) (ifindex int, mac net.HardwareAddr, ipv4 string, err error)
}

// Config is the agent's configuration.
type Config struct {
	Node   string        // host name, as in the intent
	Uplink string        // the host's interface on the fabric
	Resync time.Duration // reconcile at least this often, to pick up vifs that appeared
}

// Agent reconciles one host.
type Agent struct {
	cfg   Config
	store store.Store
	dp    Datapath
	ifs   Interfaces
	log   *slog.Logger

	mu         sync.Mutex
	locals     map[int]intent.LocalEndpoint // by vif ifindex, as last applied
	status     intent.AgentStatus
	reconciles uint64
	failures   uint64
	countersAt time.Time
	// Latest counters, published with the next status.
	drops, forwards map[string]uint64
	arpStats        *intent.ARPStats
	hooks           Hooks
	shares          *Shares // each local VM's share of the slow path
	dpRefused       map[netip.Addr]map[string]uint64
	hostsErr        string // the last node-record problem logged, so it is logged once
}

// Hooks connect the agent to the ARP engine; nil fields are skipped.
type Hooks struct {
	// Arrived is called for each VM that became local (at start, after a
	// create or a move), outside the agent's lock.
	Arrived func(ip netip.Addr)
	// Departed is called for each VM that stopped being local (moved away
	// or deleted), outside the agent's lock: any mapping this host held for
	// it predates its stay and is stale.
	Departed func(ip netip.Addr)
	// ARPStats reads the ARP engine's figures for the status record.
	ARPStats func() intent.ARPStats
}

// SetHooks installs h; call it before Run.
func (a *Agent) SetHooks(h Hooks) { a.hooks = h }

// countersEvery is how often counters go into the status record: often
// enough for `onehop stats`, rare enough not to load etcd.
const countersEvery = 5 * time.Second

// New returns an agent; Run starts it.
func New(cfg Config, s store.Store, dp Datapath, ifs Interfaces, log *slog.Logger) (*Agent, error) {
	if cfg.Node == "" {
		return nil, errors.New("agent: node name is empty")
	}
	if cfg.Uplink == "" {
		return nil, errors.New("agent: uplink interface name is empty")
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 2 * time.Second
	}
	return &Agent{cfg: cfg, store: s, dp: dp, ifs: ifs, log: log,
		shares: NewShares(DHCPPerSecond, DHCPBurst, nil)}, nil
}

// Run registers the node and reconciles until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	for {
		err := a.register(ctx)
		if err == nil {
			break
		}
		a.log.Warn("cannot register node yet; retrying", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	ticker := time.NewTicker(a.cfg.Resync)
	defer ticker.Stop()
	for {
		wctx, cancel := context.WithCancel(ctx)
		// Watch from the revision the reconcile read at, so nothing written
		// after that read is missed.
		rev, err := a.ReconcileOnce(ctx)
		if err != nil {
			a.log.Error("reconcile failed; will retry", "err", err)
		}
		changes := a.store.Watch(wctx, intent.DesiredPrefix+a.cfg.Node, rev)
		// A host joining or leaving changes whom the datapath hears.
		nodes := a.store.Watch(wctx, intent.NodesPrefix, rev)
		select {
		case <-ctx.Done():
			cancel()
			return nil
		case <-changes:
		case <-nodes:
		case <-ticker.C:
		}
		cancel()
	}
}

func (a *Agent) register(ctx context.Context) error {
	_, mac, ip, err := a.ifs.ByName(a.cfg.Uplink)
	if err != nil {
		return fmt.Errorf("uplink %s: %w", a.cfg.Uplink, err)
	}
	n := intent.Node{Name: a.cfg.Node, Uplink: a.cfg.Uplink, UplinkMAC: mac.String(), UplinkIP: ip}
	if err := store.PutJSON(ctx, a.store, intent.NodesPrefix+a.cfg.Node, n); err != nil {
		return err
	}
	a.log.Info("registered node", "node", n.Name, "uplink", n.Uplink, "mac", n.UplinkMAC, "ip", n.UplinkIP)
	return nil
}

// ReconcileOnce makes the datapath match the desired state now in the store
// and returns the store revision it read.
func (a *Agent) ReconcileOnce(ctx context.Context) (int64, error) {
	// Bounded: a stalled store must delay a pass, never stop the loop.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	kvs, rev, err := a.store.List(ctx, intent.DesiredPrefix+a.cfg.Node)
	if err != nil {
		return 0, err
	}
	d := intent.Desired{Node: a.cfg.Node, VMNet: "10.0.0.0/8"}
	if b, ok := kvs[intent.DesiredPrefix+a.cfg.Node]; ok {
		if err := json.Unmarshal(b, &d); err != nil {
			return rev, fmt.Errorf("desired state of %s: %w", a.cfg.Node, err)
		}
	}
	nodes, _, err := store.ListJSON[intent.Node](ctx, a.store, intent.NodesPrefix)
	if err != nil {
		return rev, fmt.Errorf("node records: %w", err)
	}
	err = a.apply(d, nodes)
	if time.Since(a.countersAt) >= countersEvery {
		if c, cerr := a.dp.Counters(); cerr == nil {
			a.mu.Lock()
			a.drops, a.forwards = nonZero(c.Drops), nonZero(c.Forwards)
			a.dpRefused = c.Refused
			a.countersAt = time.Now()
			a.mu.Unlock()
		}
		if a.hooks.ARPStats != nil {
			st := a.hooks.ARPStats()
			a.mu.Lock()
			a.arpStats = &st
			a.mu.Unlock()
		}
	}
	a.mu.Lock()
	a.reconciles++
	if err != nil {
		a.failures++
	}
	a.mu.Unlock()
	if serr := a.publishStatus(ctx, d, err); serr != nil && err == nil {
		err = serr
	}
	return rev, err
}

func (a *Agent) apply(d intent.Desired, nodes []intent.Node) error {
	upIndex, upMAC, _, err := a.ifs.ByName(a.cfg.Uplink)
	if err != nil {
		return fmt.Errorf("uplink %s: %w", a.cfg.Uplink, err)
	}
	entries, missing, err := datapath.Compile(d, datapath.Uplink{Ifindex: upIndex, MAC: upMAC}, func(name string) (int, error) {
		idx, _, _, err := a.ifs.ByName(name)
		return idx, err
	})
	if err != nil {
		return err
	}
	// A broken node record leaves only that host unheard.
	hosts, herr := datapath.CompileHosts(nodes, a.cfg.Node)
	entries.Hosts = hosts
	if herr != nil && herr.Error() != a.hostsErr {
		a.log.Warn("known hosts", "err", herr)
	}
	a.hostsErr = ""
	if herr != nil {
		a.hostsErr = herr.Error()
	}
	if err := a.dp.AttachUplink(a.cfg.Uplink, upIndex); err != nil {
		return err
	}
	if err := a.dp.Apply(entries, a.cfg.Uplink); err != nil {
		return err
	}
	attached := make([]string, 0, len(entries.Attach))
	for name := range entries.Attach {
		attached = append(attached, name)
	}
	sort.Strings(attached)
	locals := map[int]intent.LocalEndpoint{}
	for _, l := range d.Local {
		if idx, ok := entries.Attach[l.Interface]; ok {
			locals[idx] = l
		}
	}
	a.mu.Lock()
	var arrived []netip.Addr
	known := map[string]bool{}
	for _, l := range a.locals {
		known[l.IP] = true
	}
	for _, l := range locals {
		if !known[l.IP] {
			if ip, err := netip.ParseAddr(l.IP); err == nil {
				arrived = append(arrived, ip)
			}
		}
	}
	var departed []netip.Addr
	for _, old := range a.locals {
		if !stillLocal(locals, old.Name) {
			a.shares.Forget(old.Name)
			if ip, err := netip.ParseAddr(old.IP); err == nil {
				departed = append(departed, ip)
			}
		}
	}
	a.locals = locals
	prevMissing := a.status.MissingVifs
	a.status.AttachedVifs = attached
	a.status.MissingVifs = missing
	a.status.Endpoints = len(entries.Endpoints)
	a.mu.Unlock()
	if len(missing) > 0 && !reflect.DeepEqual(missing, prevMissing) {
		a.log.Info("waiting for vifs to appear", "vifs", missing)
	}
	if a.hooks.Departed != nil {
		for _, ip := range departed {
			a.hooks.Departed(ip)
		}
	}
	if a.hooks.Arrived != nil {
		for _, ip := range arrived {
			a.hooks.Arrived(ip)
		}
	}
	return nil
}

func (a *Agent) publishStatus(ctx context.Context, d intent.Desired, applyErr error) error {
	a.mu.Lock()
	st := a.status
	st.Node = a.cfg.Node
	st.Drops, st.Forwards, st.ARP = a.drops, a.forwards, a.arpStats
	st.Refused = a.refusalsLocked(a.dpRefused)
	st.AppliedDigest = d.Digest()
	st.Error = ""
	if applyErr != nil {
		st.AppliedDigest = ""
		st.Error = applyErr.Error()
	}
	prev := a.status
	st.Time = prev.Time
	changed := !reflect.DeepEqual(st, prev)
	if changed {
		st.Time = time.Now().UTC()
		a.status = st
	}
	a.mu.Unlock()
	if !changed {
		return nil
	}
	if applyErr == nil {
		a.log.Info("datapath reconciled", "digest", st.AppliedDigest, "endpoints", st.Endpoints, "vifs", st.AttachedVifs)
	}
	return store.PutJSON(ctx, a.store, intent.StatusPrefix+a.cfg.Node, st)
}

// refusalsLocked lists what each VM was refused: by the datapath (dp, by
// VM address) and by the agent's own slow path. a.mu must be held.
func (a *Agent) refusalsLocked(dp map[netip.Addr]map[string]uint64) []intent.VMRefusal {
	out := a.shares.Refused()
	names := map[string]string{}
	for _, l := range a.locals {
		names[l.IP] = l.Name
	}
	for ip, kinds := range dp {
		vm := names[ip.String()]
		if vm == "" {
			vm = ip.String()
		}
		for what, n := range kinds {
			out = append(out, intent.VMRefusal{VM: vm, What: what, Count: n})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].VM < out[j].VM || (out[i].VM == out[j].VM && out[i].What < out[j].What)
	})
	if len(out) == 0 {
		return nil
	}
	return out
}

// Refusals lists what each VM was refused, with the datapath's counts in dp.
func (a *Agent) Refusals(dp map[netip.Addr]map[string]uint64) []intent.VMRefusal {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.refusalsLocked(dp)
}

// Shares is the per-VM budget of the agent's slow path.
func (a *Agent) Shares() *Shares { return a.shares }

// Local returns the VM behind the vif with this ifindex, as last applied.
func (a *Agent) Local(ifindex int) (intent.LocalEndpoint, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.locals[ifindex]
	return l, ok
}

// Status returns the last reconcile's outcome and the reconcile counts.
func (a *Agent) Status() (st intent.AgentStatus, reconciles, failures uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.status, a.reconciles, a.failures
}

func nonZero(m map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range m {
		if v > 0 {
			out[k] = v
		}
	}
	return out
}

func stillLocal(locals map[int]intent.LocalEndpoint, name string) bool {
	for _, l := range locals {
		if l.Name == name {
			return true
		}
	}
	return false
}
