package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"sort"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/arpengine"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ratelog"
)

// Router is the virtual router (paper §2) as a feature, the first one: its
// compile is datapath.Compile, its sync the kernel's Apply, its background
// work the ARP engine's timers, the drop log and the slow path.
type Router struct {
	dp     Datapath
	uplink string
	log    *slog.Logger
	// arrived is told of each VM that became local; left of each that
	// is no longer (both may be nil).
	arrived  func(ip netip.Addr)
	departed func(ip netip.Addr)
	left     func(name string)
	up       func(name string) error // brings a guest interface up (nil: nothing does)
	// upPending are the attached interfaces (by ifindex) whose bringing up
	// failed, with their VMs: tried again on the next pass.
	upPending map[int]string
	work      *RouterWork

	mu        sync.Mutex
	hostsErr  string                       // the last node-record problem logged, so it is logged once
	locals    map[int]intent.LocalEndpoint // by vif ifindex, as last synced
	attached  []string
	missing   []string
	kinds     map[string]string // attached vif -> its kind
	refused   map[string]string // interface -> why no guest can be on it
	endpoints int

	// The known hosts as last compiled, and the node list they were
	// compiled from: the agent hands every pass the same list until a
	// node record changes (Agent.nodeList), and compiling a cloud's
	// worth of hosts on every pass was the router's main cost.
	hostsFrom []intent.Node
	hosts     map[datapath.HostKey]uint8
	hostsErrC error
	// uplinkAt is the ifindex the uplink was last given its program at
	// (0: not yet); Sync attaches again only when it changed.
	uplinkAt int
}

// RouterWork is what the router runs beside its maps. The daemon fills it
// in; tests leave it out.
type RouterWork struct {
	Kernel *datapath.Kernel
	Engine *arpengine.Engine
	Claims *ClaimChecker
	// Purger forgets the learned entries of VMs that left the intent.
	Purger   *MappingPurger
	SlowPath *SlowPath
	Log      *slog.Logger
	// Groups keeps the uplink joined to its scopes' multicast groups
	// (mcast.go); nil: left alone.
	Groups *UplinkGroups
	// Observer takes the datapath's events to onehop observe; nil: only
	// the drop log reads them.
	Observer *Observer
}

func newRouter(dp Datapath, uplink string, log *slog.Logger) *Router {
	return &Router{dp: dp, uplink: uplink, log: log, locals: map[int]intent.LocalEndpoint{}}
}

// routerPlan is the router's compiled entries for one node.
type routerPlan struct {
	entries  datapath.Entries
	missing  []string
	refused  map[string]string // interfaces no guest can be on, with why
	local    []intent.LocalEndpoint
	uplink   int
	hostsErr error // a node record that could not be read: that host is not heard
}

func (p *routerPlan) Sizes() feature.Sizes { return p.entries.Sizes() }

// InUse: the router is the programs' core, always on.
func (p *routerPlan) InUse() bool { return true }

// Name implements feature.Feature.
func (r *Router) Name() string { return "router" }

// Bit implements feature.Feature: the router has none, its stages always run.
func (r *Router) Bit() uint32 { return 0 }

// Maps implements feature.Feature.
func (r *Router) Maps() []feature.Map {
	rec := func(name string) feature.Map { return feature.Map{Name: name, Owner: feature.Reconciled} }
	own := func(name, lifetime string) feature.Map {
		return feature.Map{Name: name, Owner: feature.Datapath, Lifetime: lifetime}
	}
	return []feature.Map{
		rec("config"), rec("endpoints"), rec("vifs"), rec("farms"),
		rec("visibility"), rec("firewalls"), rec("firewall_rules"),
		rec("scopes"), rec("scope_members"), rec("share_config"), rec("hosts"),
		own("conntrack", "LRU of 65536 flows; an entry idle for 300 s admits nothing; checked again when the rules change"),
		own("mappings", "LRU of --mapping-table-size; the ARP engine forgets entries unused for 5 minutes or whose host stops answering"),
		own("vm_shares", "one entry per local VM, removed when the VM leaves the host; LRU of 4096"),
		own("frag_flows", "LRU of 16384 datagrams; a record admits later fragments for 2 s"),
		own("mapping_claims", "LRU of 1024 addresses; a claim goes to the agent at most once a second per address"),
		own("drops", "per-CPU counters, for as long as the pins"),
		own("forwards", "per-CPU counters, for as long as the pins"),
		own("drop_events", "ring buffer: a record lives until the agent reads it (256 KiB; a full ring drops records, not counts)"),
		rec("observe_config"),
		own("observe_budget", "per-CPU bucket per farm id, for as long as the pins: lost events count up"),
		own("slowpath", "ring buffer: a frame lives until the agent reads it (256 KiB; full: agent_busy)"),
	}
}

// Compile implements feature.Feature: the node's desired state into map
// entries (datapath.Compile). A VM whose vif does not exist yet is left out
// until it appears.
func (r *Router) Compile(n feature.Node) (feature.Plan, error) {
	e, missing, refused, err := datapath.CompileVifs(n.Desired, datapath.Uplink{Ifindex: n.UplinkIfindex, MAC: n.UplinkMAC}, vifResolver(n))
	if err != nil {
		return nil, err
	}
	// A broken node record leaves only that host unheard.
	hosts, herr := r.compileHosts(n.Nodes, n.Name)
	e.Hosts = hosts
	return &routerPlan{entries: e, missing: missing, refused: refused, local: n.Desired.Local, uplink: n.UplinkIfindex, hostsErr: herr}, nil
}

// vifResolver finds a guest's interface on n's host with its kind: a
// veth unless n can tell (feature.Node.LinkKind).
func vifResolver(n feature.Node) func(name string) (datapath.Vif, error) {
	return func(name string) (datapath.Vif, error) {
		ifindex, err := n.Ifindex(name)
		if err != nil || n.LinkKind == nil {
			return datapath.Vif{Ifindex: ifindex, Kind: datapath.VifVeth}, err
		}
		linkKind, err := n.LinkKind(name)
		if err != nil {
			return datapath.Vif{}, err // gone meanwhile: missing
		}
		kind, err := datapath.VifKindOf(linkKind)
		if err != nil {
			return datapath.Vif{}, fmt.Errorf("interface %s: %w", name, err)
		}
		return datapath.Vif{Ifindex: ifindex, Kind: kind}, nil
	}
}

// compileHosts is datapath.CompileHosts, again only when nodes is another
// list than last time (the agent never changes a list it handed over).
// The map returned is shared by plans: nothing writes to it.
func (r *Router) compileHosts(nodes []intent.Node, self string) (map[datapath.HostKey]uint8, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	same := r.hosts != nil && len(nodes) == len(r.hostsFrom) && (len(nodes) == 0 || &nodes[0] == &r.hostsFrom[0])
	if !same {
		r.hosts, r.hostsErrC = datapath.CompileHosts(nodes, self)
		r.hostsFrom = nodes
	}
	return r.hosts, r.hostsErrC
}

// Sync implements feature.Feature: the maps are made to hold exactly the
// plan (the kernel's Apply), then the VMs that arrived are announced.
func (r *Router) Sync(p feature.Plan) error {
	plan, ok := p.(*routerPlan)
	if !ok {
		return fmt.Errorf("router: plan of type %T", p)
	}
	herr := ""
	if plan.hostsErr != nil {
		herr = plan.hostsErr.Error()
	}
	r.mu.Lock()
	logHosts := herr != "" && herr != r.hostsErr
	r.hostsErr = herr
	r.mu.Unlock()
	if logHosts {
		r.log.Warn("known hosts", "err", plan.hostsErr)
	}
	if plan.uplink != r.uplinkAt {
		if err := r.dp.AttachUplink(r.uplink, plan.uplink); err != nil {
			return err
		}
		r.uplinkAt = plan.uplink
	}
	if err := r.dp.Apply(plan.entries, r.uplink); err != nil {
		return err
	}
	// Joined before a new guest is brought up, so the other hosts' first
	// questions for it reach this uplink.
	if r.work != nil && r.work.Groups != nil {
		r.work.Groups.Sync(plan.entries.Scopes)
	}
	upErr := r.bringUp(plan)
	attached := make([]string, 0, len(plan.entries.Attach))
	kinds := make(map[string]string, len(plan.entries.Attach))
	for name, ifindex := range plan.entries.Attach {
		attached = append(attached, name)
		kinds[name] = datapath.VifKindName(datapath.VifKind(plan.entries.Vifs[uint32(ifindex)].Kind))
	}
	sort.Strings(attached)
	locals := make(map[int]intent.LocalEndpoint, len(plan.entries.Attach))
	for _, l := range plan.local {
		if idx, ok := plan.entries.Attach[l.Interface]; ok {
			locals[idx] = l
		}
	}
	r.mu.Lock()
	var arrived []netip.Addr
	known := make(map[string]bool, len(r.locals))
	for _, l := range r.locals {
		known[l.IP] = true
	}
	for _, l := range locals {
		if !known[l.IP] {
			if ip, err := netip.ParseAddr(l.IP); err == nil {
				arrived = append(arrived, ip)
			}
		}
	}
	// By name, once: a scan of locals for each old one made every pass
	// cost the square of the host's VMs (issue 20, item 18).
	stay := make(map[string]bool, len(locals))
	for _, l := range locals {
		stay[l.Name] = true
	}
	var left []string
	var departed []netip.Addr
	for _, old := range r.locals {
		if !stay[old.Name] {
			left = append(left, old.Name)
			if ip, err := netip.ParseAddr(old.IP); err == nil {
				departed = append(departed, ip)
			}
		}
	}
	r.locals = locals
	prevMissing := r.missing
	prevRefused := r.refused
	r.attached, r.missing, r.endpoints = attached, plan.missing, len(plan.entries.Endpoints)
	r.kinds, r.refused = kinds, plan.refused
	r.mu.Unlock()
	for name, why := range plan.refused {
		if prevRefused[name] != why {
			r.log.Warn("guest interface refused: not attached, its VM unreachable", "interface", name, "reason", why)
		}
	}
	if len(plan.missing) > 0 && !reflect.DeepEqual(plan.missing, prevMissing) {
		// A count and a few names: the line must not grow with the VMs.
		shown, more := sample(plan.missing)
		r.log.Info("waiting for vifs to appear", "missing", len(plan.missing), "first", shown, "more", more,
			"attached", len(attached))
	}
	for _, name := range left {
		if r.left != nil {
			r.left(name)
		}
	}
	if r.departed != nil {
		for _, ip := range departed {
			r.departed(ip)
		}
	}
	if r.arrived != nil {
		sort.Slice(arrived, func(i, j int) bool { return arrived[i].Less(arrived[j]) })
		for _, ip := range arrived {
			r.arrived(ip)
		}
	}
	if upErr != nil {
		return fmt.Errorf("bring guest interfaces up: %w", upErr)
	}
	return nil
}

// Report implements feature.Reporter.
func (r *Router) Report(st *intent.AgentStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st.AttachedVifs = r.attached
	if st.AttachedVifs == nil {
		st.AttachedVifs = []string{}
	}
	st.MissingVifs = r.missing
	st.VifKinds = r.kinds
	st.RefusedVifs = r.refused
	st.Endpoints = r.endpoints
}

// Local returns the VM behind the vif with this ifindex, as last synced.
func (r *Router) Local(ifindex int) (intent.LocalEndpoint, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l, ok := r.locals[ifindex]
	return l, ok
}

// names maps each local VM's address to its name.
func (r *Router) names() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]string{}
	for _, l := range r.locals {
		out[l.IP] = l.Name
	}
	return out
}

// SetWork gives the router its background work; call it before Run.
func (r *Router) SetWork(w *RouterWork) { r.work = w }

// Run implements feature.Runner: the ARP engine's timers, the checks of
// hosts' claims on VMs, the drop log and the slow path, until ctx ends.
func (r *Router) Run(ctx context.Context) error {
	w := r.work
	if w == nil {
		<-ctx.Done()
		return nil
	}
	events, err := w.Kernel.DropEvents()
	if err != nil {
		return fmt.Errorf("open drop events: %w", err)
	}
	slow, err := w.Kernel.SlowPath()
	if err != nil {
		events.Close()
		return fmt.Errorf("open slow path: %w", err)
	}
	var wg sync.WaitGroup
	wg.Add(5)
	go func() { defer wg.Done(); runARPEngine(ctx, w.Engine, w.Log) }()
	go func() { defer wg.Done(); w.Claims.Run(ctx) }()
	go func() { defer wg.Done(); w.Purger.Run(ctx) }()
	go func() {
		defer wg.Done()
		LogDrops(events, w.Kernel.DropReason, ifname, ratelog.New(w.Log, 5, time.Second, nil), w.Observer)
	}()
	go func() { defer wg.Done(); w.SlowPath.Serve(slow, w.Log) }()
	<-ctx.Done()
	// Closing the readers ends the loops that read them.
	events.Close()
	slow.Close()
	wg.Wait()
	return nil
}
