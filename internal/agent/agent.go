// Package agent is the per-host daemon: it reports its host's uplink, watches
// the host's desired state in the store, and keeps the datapath equal to it.
// Reconciling is level-triggered: every pass computes the full map content
// from the full desired state, so a restarted agent converges on the same
// maps without touching flows that are already right.
package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/egress"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ratelog"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/version"
)

// Datapath is what the agent and its router need from the kernel datapath;
// the real one is *datapath.Kernel, tests use a fake.
type Datapath interface {
	AttachUplink(name string, ifindex int) error
	Apply(e datapath.Entries, uplinkName string) error
	Counters() (datapath.Counters, error)
	// Capacity is how many entries of one plan a map takes (-1: no such
	// map): a plan is checked against it before anything is written.
	Capacity(name string) int
	// SetFeatures sets node_config.features, the bits that switch the
	// features' datapath stages on.
	SetFeatures(bits uint32) error
}

// Interfaces looks up the host's network interfaces.
type Interfaces interface {
	// ByName returns ifindex, MAC and the first IPv4 address (may be empty).
	ByName(name string) (ifindex int, mac net.HardwareAddr, ipv4 string, err error)
}

// LinkKinds is what Interfaces that can tell a link's kind also have: the
// router delivers to a guest as its interface's kind takes frames.
// Interfaces without it (tests, simulated hosts) have only veths.
type LinkKinds interface {
	// LinkKind is the netlink kind of the interface ("veth", "tap" for a
	// tun device in tap mode, "tun", "macvtap", "bridge", ...).
	LinkKind(name string) (string, error)
}

// PrefixBits is what Interfaces that can read an address's prefix length
// also have: the node record tells the controller the fabric's prefix.
type PrefixBits interface {
	// PrefixBits is the prefix length of address ip on interface name.
	PrefixBits(name, ip string) (int, error)
}

// Neighbors is what Interfaces that can read the neighbour table also
// have: a TAP collector's MAC, as the uplink resolved it.
type Neighbors interface {
	// Neighbor is ip's MAC on link ifindex; while it is not known, an
	// error, and resolving it has begun.
	Neighbor(ifindex int, ip netip.Addr) (net.HardwareAddr, error)
}

// Config is the agent's configuration.
type Config struct {
	Node   string        // host name, as in the intent
	Uplink string        // the host's interface on the fabric (index 0, the router's)
	Resync time.Duration // reconcile at least this often, to pick up vifs that appeared
	// MoreUplinks are a multi-homed host's other links to the fabric
	// (indexes 1, 2, ...): slivers may lease ports on their addresses too.
	MoreUplinks []string
	// Ephemeral reads the host's own ip_local_port_range, reported so the
	// controller refuses leases inside it; nil reports none.
	Ephemeral func() (lo, hi uint16, err error)
	// SliverCgroups is the cgroup v2 directory whose child S holds sliver
	// S's processes; "" when the host has no slivers' processes to confine.
	SliverCgroups string
	// LocationServer is the VNAT location server (the controller's fabric
	// address) the host relays its VMs' location streams to
	// (internal/vnatrelay); invalid: no relay.
	LocationServer netip.Addr
	// LocationTLS is the agent's TLS client configuration (its own
	// certificate, CN = Node, and the cluster's CA) the relay dials the
	// location server with: the server takes relays on no other channel.
	// Nil (--insecure): no relay.
	LocationTLS *tls.Config
	// StatusEvery paces status writes while changes keep coming: at most
	// one per interval (0: sized to the number of hosts; statuspub.go).
	StatusEvery time.Duration
}

// uplinks lists every uplink name, index 0 first.
func (c Config) uplinks() []string { return append([]string{c.Uplink}, c.MoreUplinks...) }

// Agent reconciles one host.
type Agent struct {
	cfg   Config
	store store.Store
	dp    Datapath
	ifs   Interfaces
	log   *slog.Logger

	router   *Router
	features []feature.Feature // the registry: one sub-controller each
	// listeners counts the agent's listeners (metrics, the VNAT location
	// relay): onehop_listener_* with the node label.
	listeners *accept.Stats
	bits      uint32 // node_config.features as last written

	mu         sync.Mutex
	subs       map[string]*subController
	status     intent.AgentStatus
	reconciles uint64
	failures   uint64
	countersAt time.Time
	// Latest counters, published with the next status.
	drops, forwards map[string]uint64
	arpStats        *intent.ARPStats
	hooks           Hooks
	readyOnce       sync.Once // hooks.Ready is called once
	shares          *Shares   // each local VM's share of the slow path
	dpRefused       map[netip.Addr]map[string]uint64
	lists, relists  uint64 // full lists of the store, and those after a lost watch

	// The status as last made (status) is numbered by statusSeq; the
	// publisher writes it, paced (statuspub.go). statusKick wakes it.
	statusSeq                         uint64
	statusKick                        chan struct{}
	statusWrites, statusWriteFailures uint64
	statusLog                         *ratelog.Logger
	knownHosts                        atomic.Int64 // node records held: the self-sized status pace
	statusBytes                       atomic.Int64 // the size of the status last written: the same
	statusNow                         atomic.Bool  // the next write skips the pace (publishNow)
	// pubMu serialises status writes and guards what was written last.
	pubMu        sync.Mutex
	publishedSeq uint64
	publishedAt  time.Time

	// passMu serialises passes and guards what they read: the view of
	// the host's desired keys, the node records, the revision of the
	// last change taken in, and the desired state last applied.
	passMu  sync.Mutex
	view    *intent.View
	nodes   map[string]intent.Node
	viewRev int64
	// seenRev is viewRev as last set, read without passMu (Ready): a pass
	// holds passMu for as long as it runs.
	seenRev atomic.Int64
	applied intent.Desired
	// nodeList is nodes sorted by name, made again only when nodes
	// changed (nil): every pass hands it to the features, and it is as
	// long as the cloud has hosts.
	nodeList []intent.Node
	// uplinksAt is the ifindex each extra uplink (index > 0) was last
	// given the uplink program at, by name: a pass attaches it only
	// when it has none yet or the interface was made again (a new
	// ifindex), as the router does for uplink 0.
	uplinksAt map[string]int
	// linkKick asks for a pass: a link appeared, went or was made again
	// (linkwatch.go).
	linkKick chan struct{}
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
	// Ready is called once, after the first pass that applied the whole
	// desired state (the daemon tells systemd it is ready).
	Ready func()
	// FloatingArrived is called for a floating address this host began
	// to hold (a VM's, after an attach or a move), under the egress
	// feature's lock: the daemon sends a gratuitous ARP for it.
	FloatingArrived func(addr netip.Addr)
}

// SetHooks installs h; call it before Run.
func (a *Agent) SetHooks(h Hooks) {
	a.hooks = h
	a.router.arrived, a.router.departed = h.Arrived, h.Departed
	for _, f := range a.features {
		if e, ok := f.(*egress.Feature); ok && h.FloatingArrived != nil {
			e.WithAnnounce(h.FloatingArrived)
		}
	}
}

// countersEvery is how often counters go into the status record: often
// enough for `onehop stats`, rare enough not to load etcd.
const countersEvery = 5 * time.Second

// passTimeout bounds one reconcile pass: a pass whose features are slow
// stops at its deadline and leaves the rest to the next pass, instead of
// running on while the watches' events wait for passMu. What a pass calls
// (BPF map writes, netlink, a feature's Sync) takes no context, so the
// bound is checked between features (apply): no sync starts after the
// deadline, but one already running is not cut short.
const passTimeout = 10 * time.Second

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
	a := &Agent{cfg: cfg, store: s, dp: dp, ifs: ifs, log: log,
		shares: NewShares(DHCPPerSecond, DHCPBurst, nil), subs: map[string]*subController{},
		view: intent.NewView(cfg.Node), nodes: map[string]intent.Node{},
		statusKick: make(chan struct{}, 1), statusLog: ratelog.New(log, 1, time.Minute, nil),
		linkKick: make(chan struct{}, 1)}
	a.router = newRouter(dp, cfg.Uplink, log)
	if u, ok := ifs.(LinkUpper); ok {
		a.router.up = u.SetUp
	}
	a.router.left = a.shares.Forget
	a.listeners = accept.NewStats(prometheus.Labels{"node": cfg.Node})
	env := Env{Router: a.router, Log: log, Node: cfg.Node, SliverCgroups: cfg.SliverCgroups, LocationServer: cfg.LocationServer,
		LocationTLS: cfg.LocationTLS, Listeners: a.listeners}
	if k, ok := dp.(*datapath.Kernel); ok {
		env.Kernel = k
	}
	a.features = registry(env)
	if err := feature.Check(a.features); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	for _, f := range a.features {
		if l, ok := f.(feature.Loader); ok {
			if err := l.Load(); err != nil {
				return nil, fmt.Errorf("agent: %w", err)
			}
		}
	}
	for _, f := range a.features {
		a.subs[f.Name()] = &subController{}
	}
	return a, nil
}

// Features lists the registered features, in sync order.
func (a *Agent) Features() []feature.Feature { return a.features }

// Router is the virtual router feature.
func (a *Agent) Router() *Router { return a.router }

// Run registers the node and reconciles until ctx ends: it lists its
// desired keys once, then applies what its watches report, change by
// change, relisting only when a watch is lost (a compacted revision, an
// error, the store gone). Every Resync it also applies again from what it
// holds, without reading the store, to pick up vifs that appeared.
func (a *Agent) Run(ctx context.Context) error {
	pctx, stopPublisher := context.WithCancel(ctx)
	published := make(chan struct{})
	go func() {
		defer close(published)
		a.publishStatuses(pctx)
	}()
	// The publisher is gone before Run returns: the caller may close the
	// store next.
	defer func() { stopPublisher(); <-published }()
	traced := make(chan struct{})
	go func() {
		defer close(traced)
		a.serveTraces(pctx)
	}()
	defer func() { stopPublisher(); <-traced }()
	if w, ok := a.ifs.(LinkEvents); ok {
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			a.watchLinks(pctx, w)
		}()
		defer func() { stopPublisher(); <-watched }()
	}
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
	for {
		rev, err := a.relist(ctx)
		// A full list is rare (start, a lost watch): its outcome is
		// written at once, unpaced, but by the publisher: the loop
		// goes on to follow the watches meanwhile.
		a.publishNow()
		if err != nil {
			a.log.Error("reconcile failed; will retry", "err", err)
		}
		if rev == 0 {
			// Nothing was read: try the store again after a while.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(a.cfg.Resync):
			}
			continue
		}
		err = a.follow(ctx, rev)
		if ctx.Err() != nil {
			return nil
		}
		a.mu.Lock()
		a.relists++
		a.mu.Unlock()
		a.log.Warn("watch lost; listing the desired state again", "err", err)
	}
}

// source is where a watched batch came from.
type source struct {
	farm   uint16
	isFarm bool
	nodes  bool
}

type sourced struct {
	src source
	b   store.Batch
}

// urgent says a batch is not held back by the pass pace: a farm's state
// (its rules) or a node record changed, rare and awaited, or a watch broke.
func (s sourced) urgent() bool { return s.src.isFarm || s.src.nodes || s.b.Err != nil }

// errWatchEnded is a watch that closed without saying why.
var errWatchEnded = errors.New("watch ended")

// follow applies the changes the watches report, from revision rev, until
// one of them breaks (its error is returned) or ctx ends.
func (a *Agent) follow(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	in := make(chan sourced, 64)
	forward := func(fctx context.Context, src source, ch <-chan store.Batch) {
		go func() {
			for b := range ch {
				select {
				case in <- sourced{src, b}:
				case <-fctx.Done():
					return
				}
			}
			if fctx.Err() == nil {
				select {
				case in <- sourced{src, store.Batch{Err: errWatchEnded}}:
				case <-fctx.Done():
				}
			}
		}()
	}
	forward(wctx, source{}, a.store.WatchEvents(wctx, intent.DesiredHostPrefix(a.cfg.Node), rev))
	// A host joining or leaving changes whom the datapath hears.
	forward(wctx, source{nodes: true}, a.store.WatchEvents(wctx, intent.NodesPrefix, rev))
	farms := map[uint16]context.CancelFunc{}
	defer func() {
		for _, stop := range farms {
			stop()
		}
	}()
	// watchFarms follows the farm states the view needs, and only those:
	// a farm the host carries no VM of sends it nothing.
	watchFarms := func(from int64) error {
		need := map[uint16]bool{}
		a.passMu.Lock()
		carried := a.view.Farms()
		a.passMu.Unlock()
		for _, id := range carried {
			need[id] = true
			if farms[id] != nil {
				continue
			}
			start := from
			if start == 0 {
				// A farm the host just started carrying: read its
				// state now and follow it from there.
				kvs, r, err := a.store.List(ctx, intent.FarmStateKey(id))
				if err != nil {
					return fmt.Errorf("farm state %d: %w", id, err)
				}
				if err := a.takeFarm(intent.FarmStateKey(id), kvs[intent.FarmStateKey(id)], r); err != nil {
					return err
				}
				start = r
			}
			fctx, stop := context.WithCancel(wctx)
			farms[id] = stop
			forward(fctx, source{farm: id, isFarm: true}, a.store.WatchEvents(fctx, intent.FarmStateKey(id), start))
		}
		for id, stop := range farms {
			if !need[id] {
				stop()
				delete(farms, id)
				a.passMu.Lock()
				a.view.DeleteFarm(id)
				a.passMu.Unlock()
			}
		}
		return nil
	}
	if err := watchFarms(rev); err != nil {
		return err
	}
	ticker := time.NewTicker(a.cfg.Resync)
	defer ticker.Stop()
	var pace passPace
	for {
		var batch []sourced
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			if _, err := a.pass(ctx, "resync", 0); err != nil {
				a.log.Error("reconcile failed; will retry", "err", err)
			}
			continue
		case <-a.linkKick:
			if _, err := a.pass(ctx, "link", 0); err != nil {
				a.log.Error("reconcile failed; will retry", "err", err)
			}
			continue
		case got := <-in:
			batch = append(batch, got)
		}
		// Changes to the host's own keys (VMs, slivers, TAP rules) wait
		// for the pace, gathering meanwhile; a farm's rules, a node
		// record or a broken watch end the wait.
		urgent := batch[0].urgent()
		if d := pace.hold(time.Now()); d > 0 && !urgent {
			t := time.NewTimer(d)
		hold:
			for {
				select {
				case <-ctx.Done():
					t.Stop()
					return nil
				case <-t.C:
					break hold
				case got := <-in:
					batch = append(batch, got)
					if urgent = got.urgent(); urgent {
						t.Stop()
						break hold
					}
				}
			}
		}
		// Take whatever else has arrived: one pass applies it all.
	drain:
		for {
			select {
			case got := <-in:
				batch = append(batch, got)
				urgent = urgent || got.urgent()
			default:
				break drain
			}
		}
		events := 0
		for _, got := range batch {
			if got.src.isFarm && farms[got.src.farm] == nil {
				continue // a farm no longer followed
			}
			if got.b.Err != nil {
				return got.b.Err
			}
			events += len(got.b.Events)
			if err := a.take(got.src, got.b.Events); err != nil {
				return err
			}
		}
		if err := watchFarms(0); err != nil {
			return err
		}
		start := time.Now()
		if _, err := a.pass(ctx, "change", events); err != nil {
			a.log.Error("reconcile failed; will retry", "err", err)
		}
		if !urgent {
			pace.passed(start, time.Now())
		}
	}
}

// PassShare and PassBurst pace the passes that apply changes: they may
// take a burst of PassBurst of pass time at once, and beyond it 1/PassShare
// of a CPU while changes keep coming. A pass costs what the host carries
// (every pass compiles and applies the whole desired state,
// level-triggered), so one pass per change made each create on a full host
// cost its agent more (issue 20, item 18: a pass at 2,000 VMs took 7-11 ms,
// and a stream of creates kept three lab agents busy on the controller's
// CPUs: creates went from 327 to 87 a second as the hosts filled). Paced,
// the passes of a stream take more changes each as they grow dearer, and
// a change's share of them stays the same; a change that comes while the
// burst lasts (one after a quiet spell, a few rule changes in a row) is
// applied at once. A change of a farm's rules or of a node record is
// applied at once whatever the pace, and its pass is not charged to it:
// those are rare, and awaited everywhere.
const (
	PassShare = 10
	PassBurst = 250 * time.Millisecond
)

// passPace is the pass time the agent may spend now (a token bucket):
// credit, as of at, grows by 1/PassShare of the time that passes, up to
// PassBurst, and each paced pass takes what it cost.
type passPace struct {
	credit time.Duration
	at     time.Time
}

func (p *passPace) refill(now time.Time) {
	if p.at.IsZero() {
		p.credit = PassBurst
	} else if now.After(p.at) {
		p.credit = min(PassBurst, p.credit+now.Sub(p.at)/PassShare)
	}
	p.at = now
}

// passed charges a paced pass that ran from start to end.
func (p *passPace) passed(start, end time.Time) {
	p.refill(end)
	p.credit -= end.Sub(start)
}

// hold is how long the next pass must wait at now (0: it may run).
func (p *passPace) hold(now time.Time) time.Duration {
	p.refill(now)
	if p.credit >= 0 {
		return 0
	}
	return -p.credit * PassShare
}

// take applies watched events to the view and node records.
func (a *Agent) take(src source, events []store.Event) error {
	a.passMu.Lock()
	defer a.passMu.Unlock()
	for _, e := range events {
		switch {
		case src.nodes:
			a.nodeList = nil
			name := strings.TrimPrefix(e.Key, intent.NodesPrefix)
			if e.Deleted {
				delete(a.nodes, name)
				continue
			}
			var n intent.Node
			if err := json.Unmarshal(e.Value, &n); err != nil {
				// One bad record leaves that host unheard, as a list does.
				a.log.Warn("node record", "key", e.Key, "err", err)
				delete(a.nodes, name)
				continue
			}
			a.nodes[name] = n
		case src.isFarm:
			if err := a.takeFarmLocked(e.Key, e.Value, e.Rev); err != nil {
				return err
			}
		default:
			if e.Deleted {
				a.view.Delete(e.Key)
			} else if err := a.view.Set(e.Key, e.Value); err != nil {
				return err
			}
			a.viewRev = max(a.viewRev, e.Rev)
			a.seenRev.Store(a.viewRev)
		}
	}
	return nil
}

// takeFarm sets a farm's state from its key's value (nil: none).
func (a *Agent) takeFarm(key string, v []byte, rev int64) error {
	a.passMu.Lock()
	defer a.passMu.Unlock()
	return a.takeFarmLocked(key, v, rev)
}

func (a *Agent) takeFarmLocked(key string, v []byte, rev int64) error {
	id, ok := intent.ParseFarmStateKey(key)
	if !ok {
		return fmt.Errorf("farm state key %s", key)
	}
	if v == nil {
		a.view.DeleteFarm(id)
	} else {
		var f intent.FarmState
		if err := json.Unmarshal(v, &f); err != nil {
			return fmt.Errorf("decode %s: %w", key, err)
		}
		a.view.SetFarm(f)
	}
	a.viewRev = max(a.viewRev, rev)
	a.seenRev.Store(a.viewRev)
	return nil
}

func (a *Agent) register(ctx context.Context) error {
	_, mac, ip, err := a.ifs.ByName(a.cfg.Uplink)
	if err != nil {
		return fmt.Errorf("uplink %s: %w", a.cfg.Uplink, err)
	}
	n := intent.Node{Name: a.cfg.Node, Uplink: a.cfg.Uplink, UplinkMAC: mac.String(), UplinkIP: ip}
	for i, name := range a.cfg.uplinks() {
		_, mac, ip, err := a.ifs.ByName(name)
		if err != nil {
			return fmt.Errorf("uplink %s: %w", name, err)
		}
		u := intent.NodeUplink{Index: i, Name: name, MAC: mac.String(), IP: ip}
		if pb, ok := a.ifs.(PrefixBits); ok && ip != "" {
			// The fabric's prefix: where a TAP collector may be.
			if u.Bits, err = pb.PrefixBits(name, ip); err != nil {
				return fmt.Errorf("uplink %s: %w", name, err)
			}
		}
		n.Uplinks = append(n.Uplinks, u)
	}
	if a.cfg.Ephemeral != nil {
		if n.EphemeralLo, n.EphemeralHi, err = a.cfg.Ephemeral(); err != nil {
			return fmt.Errorf("ephemeral port range: %w", err)
		}
	}
	// Unchanged, it is not written again: every agent watches the node
	// records, and a restart that changed nothing must cost them nothing.
	b, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("encode node record: %w", err)
	}
	if cur, err := a.store.Get(ctx, intent.NodesPrefix+a.cfg.Node); err != nil || !bytes.Equal(cur, b) {
		if err := a.store.Put(ctx, intent.NodesPrefix+a.cfg.Node, b); err != nil {
			return err
		}
	}
	a.log.Info("registered node", "node", n.Name, "uplink", n.Uplink, "mac", n.UplinkMAC, "ip", n.UplinkIP)
	return nil
}

// ReconcileOnce lists the desired state now in the store (the host's
// keys, the farm states its VMs need, the node records), makes the
// datapath match it and returns the store revision it read at: a full
// relist, which Run does at start and when a watch is lost. The status it
// makes is written before it returns.
func (a *Agent) ReconcileOnce(ctx context.Context) (int64, error) {
	rev, err := a.relist(ctx)
	if serr := a.flushStatus(ctx); serr != nil && err == nil {
		err = fmt.Errorf("status: %w", serr)
	}
	return rev, err
}

// relist is ReconcileOnce but for the status, which it leaves to the
// publisher.
func (a *Agent) relist(ctx context.Context) (int64, error) {
	// Bounded: a stalled store must delay a pass, never stop the loop.
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	kvs, rev, err := a.store.List(lctx, intent.DesiredHostPrefix(a.cfg.Node))
	if err != nil {
		return 0, err
	}
	view := intent.NewView(a.cfg.Node)
	for k, v := range kvs {
		if err := view.Set(k, v); err != nil {
			return 0, fmt.Errorf("desired state of %s: %w", a.cfg.Node, err)
		}
	}
	for _, id := range view.Farms() {
		fk := intent.FarmStateKey(id)
		fs, _, err := a.store.List(lctx, fk)
		if err != nil {
			return 0, fmt.Errorf("farm state %d: %w", id, err)
		}
		if b, ok := fs[fk]; ok {
			var f intent.FarmState
			if err := json.Unmarshal(b, &f); err != nil {
				return 0, fmt.Errorf("decode %s: %w", fk, err)
			}
			view.SetFarm(f)
		}
	}
	nodeKVs, _, err := a.store.List(lctx, intent.NodesPrefix)
	if err != nil {
		return 0, fmt.Errorf("node records: %w", err)
	}
	nodes := map[string]intent.Node{}
	for k, b := range nodeKVs {
		var n intent.Node
		if err := json.Unmarshal(b, &n); err != nil {
			a.log.Warn("node record", "key", k, "err", err)
			continue
		}
		nodes[strings.TrimPrefix(k, intent.NodesPrefix)] = n
	}
	a.passMu.Lock()
	if view.Desired().Digest() != a.applied.Digest() || a.viewRev == 0 {
		a.viewRev = rev
		a.seenRev.Store(rev)
	}
	a.view, a.nodes, a.nodeList = view, nodes, nil
	a.passMu.Unlock()
	a.mu.Lock()
	a.lists++
	a.mu.Unlock()
	_, err = a.pass(ctx, "list", len(kvs))
	return rev, err
}

// pass makes the datapath match the view, publishes the status and logs
// what changed, and returns the desired state it applied.
func (a *Agent) pass(ctx context.Context, why string, events int) (intent.Desired, error) {
	a.passMu.Lock()
	defer a.passMu.Unlock()
	// The clock starts once the view is ours: time spent waiting for
	// another pass is not this pass's.
	ctx, cancel := context.WithTimeout(ctx, passTimeout)
	defer cancel()
	start := time.Now()
	d := a.view.Desired()
	if a.nodeList == nil {
		a.knownHosts.Store(int64(len(a.nodes)))
		a.nodeList = make([]intent.Node, 0, len(a.nodes))
		for _, name := range sortedNames(a.nodes) {
			a.nodeList = append(a.nodeList, a.nodes[name])
		}
	}
	err := a.apply(ctx, d, a.nodeList)
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
	if err == nil {
		if ch := diffDesired(a.applied, d); !ch.empty() {
			a.log.Info("datapath reconciled", append([]any{"why", why, "events", events}, append(ch.attrs(),
				"vms", len(d.Local), "revision", a.viewRev, "took", time.Since(start).Round(time.Microsecond))...)...)
		}
		a.applied = d
	}
	a.noteStatus(d, err)
	if err == nil && a.hooks.Ready != nil {
		a.readyOnce.Do(a.hooks.Ready)
	}
	return d, err
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// subController is one feature's reconcile: compiled, checked against its
// maps' capacities and synced on its own, so one feature's failure never
// stops another's.
type subController struct {
	reconciles, failures uint64
	err                  error
	sizes                feature.Sizes
	overflows            []feature.Overflow
}

// apply runs every feature's sub-controller on d. Features going out of use
// lose their bit before their maps are emptied; features coming into use
// get it only once their maps are written. A feature not yet synced when
// ctx ends is left, failed, for the next pass.
func (a *Agent) apply(ctx context.Context, d intent.Desired, nodes []intent.Node) error {
	upIndex, upMAC, _, err := a.ifs.ByName(a.cfg.Uplink)
	if err != nil {
		return fmt.Errorf("uplink %s: %w", a.cfg.Uplink, err)
	}
	node := feature.Node{Name: a.cfg.Node, Desired: d, Nodes: nodes, UplinkIfindex: upIndex, UplinkMAC: upMAC, Ifindex: func(name string) (int, error) {
		idx, _, _, err := a.ifs.ByName(name)
		return idx, err
	}}
	if k, ok := a.ifs.(LinkKinds); ok {
		node.LinkKind = k.LinkKind
	}
	if nb, ok := a.ifs.(Neighbors); ok {
		node.Neighbor = func(ip netip.Addr) (net.HardwareAddr, error) { return nb.Neighbor(upIndex, ip) }
	}
	for i, name := range a.cfg.uplinks() {
		idx, mac, ip, err := a.ifs.ByName(name)
		if err != nil {
			return fmt.Errorf("uplink %s: %w", name, err)
		}
		u := feature.Uplink{Index: i, Name: name, Ifindex: idx, MAC: mac}
		if addr, err := netip.ParseAddr(ip); err == nil {
			u.Addr = addr
		}
		node.Uplinks = append(node.Uplinks, u)
		if i > 0 && a.uplinksAt[name] != idx {
			// The router attaches uplink 0; the others carry only what
			// features steer (slivers' leases on their addresses). A
			// failed attach is not recorded: the next pass tries again.
			if err := a.dp.AttachUplink(name, idx); err != nil {
				return err
			}
			if a.uplinksAt == nil {
				a.uplinksAt = map[string]int{}
			}
			a.uplinksAt[name] = idx
		}
	}
	plans := make([]feature.Plan, len(a.features))
	sizes := make([]feature.Sizes, len(a.features))
	errs := make([]error, len(a.features))
	want := uint32(0)
	for i, f := range a.features {
		plans[i], errs[i] = f.Compile(node)
		if errs[i] == nil {
			sizes[i] = plans[i].Sizes() // a plan's layout is worked out once a pass
			if plans[i].InUse() {
				want |= f.Bit()
			}
		}
	}
	if keep := a.bits & want; keep != a.bits {
		if err := a.dp.SetFeatures(keep); err != nil {
			return err
		}
		a.bits = keep
	}
	on := a.bits
	for i, f := range a.features {
		if errs[i] == nil {
			errs[i] = feature.CheckFit(f.Name(), sizes[i], a.dp.Capacity)
		}
		if errs[i] == nil && ctx.Err() != nil {
			errs[i] = fmt.Errorf("not synced, the pass ran out of time: %w", ctx.Err())
		}
		if errs[i] == nil {
			errs[i] = f.Sync(plans[i])
		}
		if errs[i] == nil {
			on |= want & f.Bit()
		}
		a.mu.Lock()
		sub := a.subs[f.Name()]
		sub.reconciles++
		sub.err = errs[i]
		sub.overflows = feature.Overflows(errs[i])
		if plans[i] != nil {
			sub.sizes = sizes[i]
		}
		if errs[i] != nil {
			sub.failures++
		}
		a.mu.Unlock()
		if errs[i] != nil {
			errs[i] = fmt.Errorf("%s: %w", f.Name(), errs[i])
			a.log.Error("feature not reconciled", "feature", f.Name(), "err", errs[i])
		}
	}
	if on != a.bits {
		if err := a.dp.SetFeatures(on); err != nil {
			return err
		}
		a.bits = on
	}
	return errors.Join(errs...)
}

// noteStatus makes the status of a pass that applied d (or failed with
// applyErr) and hands it to the publisher if it changed.
func (a *Agent) noteStatus(d intent.Desired, applyErr error) {
	a.mu.Lock()
	st := a.status
	st.Node = a.cfg.Node
	st.Drops, st.Forwards, st.ARP = a.drops, a.forwards, a.arpStats
	st.Refused = a.refusalsLocked(a.dpRefused)
	st.Overflows = nil
	for _, f := range a.features {
		if r, ok := f.(feature.Reporter); ok {
			r.Report(&st)
		}
		for _, o := range a.subs[f.Name()].overflows {
			st.Overflows = append(st.Overflows, intent.MapOverflow{Feature: f.Name(), Map: o.Map, Want: o.Want, Capacity: o.Capacity})
		}
	}
	st.AppliedDigest = d.Digest()
	st.AppliedRevision = a.viewRev
	v := version.Get()
	st.Version = &v
	st.Error = ""
	if applyErr != nil {
		st.AppliedDigest = ""
		st.AppliedRevision = 0
		st.Error = applyErr.Error()
	}
	prev := a.status
	st.Time = prev.Time
	if !reflect.DeepEqual(st, prev) {
		st.Time = time.Now().UTC()
		a.noteStatusLocked(st)
	}
	a.mu.Unlock()
}

// refusalsLocked lists what each VM was refused: by the datapath (dp, by
// VM address) and by the agent's own slow path. a.mu must be held.
func (a *Agent) refusalsLocked(dp map[netip.Addr]map[string]uint64) []intent.VMRefusal {
	out := a.shares.Refused()
	var names map[string]string
	if len(dp) > 0 { // made on every pass, so only when needed: as long as the host's VMs
		names = a.router.names()
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
func (a *Agent) Local(ifindex int) (intent.LocalEndpoint, bool) { return a.router.Local(ifindex) }

// MapUse is one reconciled map's use as of the last pass: entries wanted,
// and how many of them did not fit (0: all did).
type MapUse struct {
	Feature, Map   string
	Want, Capacity int
	Over           int
}

// MapUses lists every reconciled map's use as of the last pass, by feature
// and map, for metrics.
func (a *Agent) MapUses() []MapUse {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []MapUse
	for _, f := range a.features {
		sub := a.subs[f.Name()]
		for name, n := range sub.sizes {
			u := MapUse{Feature: f.Name(), Map: name, Want: n, Capacity: a.dp.Capacity(name)}
			if n > u.Capacity {
				u.Over = n - u.Capacity
			}
			out = append(out, u)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Feature+out[i].Map < out[j].Feature+out[j].Map })
	return out
}

// Lists returns how many times the agent listed its desired state in full,
// and how many of those followed a lost watch.
func (a *Agent) Lists() (lists, relists uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lists, a.relists
}

// Ready says why the host is not ready, nil once it is: the datapath
// attached and reconciled to the latest revision of this host's desired
// state the agent has seen (the agent's /readyz).
func (a *Agent) Ready() error {
	a.mu.Lock()
	st, passes := a.status, a.reconciles
	a.mu.Unlock()
	seen := a.seenRev.Load()
	switch {
	case passes == 0:
		return errors.New("no reconcile pass yet")
	case st.Error != "":
		return fmt.Errorf("the last reconcile failed: %s", st.Error)
	case st.AppliedRevision < seen:
		return fmt.Errorf("reconciled to revision %d, has seen %d", st.AppliedRevision, seen)
	}
	return nil
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
