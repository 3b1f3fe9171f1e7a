package vnat

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Options say where the endpoint is.
type Options struct {
	// Netns is the path of the network namespace the endpoint's interface,
	// addresses and sockets are in ("" = the caller's). Every interface,
	// route, address and socket call runs there.
	Netns string
	// XlateEntries sizes vnat_xlate (two entries per migrated connection);
	// 0 keeps the C default.
	XlateEntries uint32
}

// Datapath is VNAT loaded into the kernel for one endpoint: the programs,
// their maps, the links attaching them, and the migrated connections.
type Datapath struct {
	opts  Options
	objs  vnatObjects
	links map[string]link.Link

	mu     sync.Mutex
	table  *Table
	routes map[netip.Addr]netip.Addr // virtual remote -> physical, installed
	kept   map[netip.Addr]bool       // addresses KeepLocal added
	// resyncing makes syncRoutes rewrite routes it believes installed.
	resyncing bool
	diag      map[Tuple]Conn // connections picked up by sock_diag
	// away are the connections in vnat_away (their peer is away: the
	// keepalive helper answers their probes).
	away map[Virtual]bool
	// counterNames index vnat_counters (enum vnat_counter, from BTF).
	counterNames []string
}

// Open loads the programs and maps (nothing attached yet).
func Open(o Options) (*Datapath, error) {
	spec, err := loadVnat()
	if err != nil {
		return nil, fmt.Errorf("vnat: load spec: %w", err)
	}
	if o.XlateEntries > 0 {
		spec.Maps["vnat_xlate"].MaxEntries = o.XlateEntries
	}
	names, err := counterNames(spec)
	if err != nil {
		return nil, err
	}
	d := &Datapath{opts: o, links: map[string]link.Link{}, table: NewTable(),
		routes: map[netip.Addr]netip.Addr{}, kept: map[netip.Addr]bool{}, diag: map[Tuple]Conn{}, away: map[Virtual]bool{},
		counterNames: names}
	if err := spec.LoadAndAssign(&d.objs, nil); err != nil {
		return nil, fmt.Errorf("vnat: load programs: %+v", err)
	}
	return d, nil
}

// counterNames reads enum vnat_counter from BTF, so Go never repeats the
// C's list: "egress_translated", ... (VNAT_COUNTER_MAX left out).
func counterNames(spec *ebpf.CollectionSpec) ([]string, error) {
	var e *btf.Enum
	if err := spec.Types.TypeByName("vnat_counter", &e); err != nil {
		return nil, fmt.Errorf("vnat: btf enum vnat_counter: %w", err)
	}
	names := make([]string, vnatVnatCounterVNAT_COUNTER_MAX)
	for _, v := range e.Values {
		if v.Value < uint64(len(names)) {
			names[v.Value] = strings.ToLower(strings.TrimPrefix(v.Name, "VNAT_"))
		}
	}
	return names, nil
}

// Programs are the loaded programs, for BPF_PROG_RUN tests and benchmarks.
func (d *Datapath) Programs() (egress, ingress, sockops *ebpf.Program) {
	return d.objs.VnatEgress, d.objs.VnatIngress, d.objs.VnatSockops
}

// Close detaches everything, removes the routes and kept addresses it
// added, and unloads the programs.
func (d *Datapath) Close() error {
	var errs []error
	for name, l := range d.links {
		if err := l.Close(); err != nil {
			errs = append(errs, fmt.Errorf("detach %s: %w", name, err))
		}
		delete(d.links, name)
	}
	d.mu.Lock()
	for va := range d.routes {
		if err := d.delRoute(va); err != nil {
			errs = append(errs, err)
		}
	}
	d.mu.Unlock()
	if err := d.objs.Close(); err != nil {
		errs = append(errs, fmt.Errorf("unload vnat: %w", err))
	}
	return errors.Join(errs...)
}

// inNS runs fn in the endpoint's namespace: on a locked thread that is
// thrown away afterwards, so no other goroutine ever runs there.
func (d *Datapath) inNS(fn func() error) error {
	if d.opts.Netns == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		ns, err := netns.GetFromPath(d.opts.Netns)
		if err != nil {
			errc <- fmt.Errorf("open namespace %s: %w", d.opts.Netns, err)
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter namespace %s: %w", d.opts.Netns, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// handle is a netlink handle in the endpoint's namespace, for routes,
// addresses and sock_diag.
func (d *Datapath) handle() (*netlink.Handle, error) {
	fams := []int{unix.NETLINK_ROUTE, unix.NETLINK_INET_DIAG}
	if d.opts.Netns == "" {
		return netlink.NewHandle(fams...)
	}
	ns, err := netns.GetFromPath(d.opts.Netns)
	if err != nil {
		return nil, fmt.Errorf("open namespace %s: %w", d.opts.Netns, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, fams...)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", d.opts.Netns, err)
	}
	return h, nil
}

// AttachInterface attaches the translation to ifname's tcx ingress and egress.
func (d *Datapath) AttachInterface(ifname string) error {
	return d.inNS(func() error {
		ifc, err := netlink.LinkByName(ifname)
		if err != nil {
			return fmt.Errorf("vnat: interface %s: %w", ifname, err)
		}
		for _, a := range []struct {
			name string
			prog *ebpf.Program
			at   ebpf.AttachType
		}{
			{"ingress/" + ifname, d.objs.VnatIngress, ebpf.AttachTCXIngress},
			{"egress/" + ifname, d.objs.VnatEgress, ebpf.AttachTCXEgress},
		} {
			if _, ok := d.links[a.name]; ok {
				continue
			}
			l, err := link.AttachTCX(link.TCXOptions{Interface: ifc.Attrs().Index, Program: a.prog, Attach: a.at})
			if err != nil {
				return fmt.Errorf("vnat: attach %s to %s: %w", a.at, ifname, err)
			}
			d.links[a.name] = l
		}
		return nil
	})
}

// AttachCgroup attaches the connection recorder (sockops) to a cgroup v2
// directory: TCP connections its processes establish from now on are
// recorded, and forgotten when they close.
func (d *Datapath) AttachCgroup(path string) error {
	name := "sockops/" + path
	if _, ok := d.links[name]; ok {
		return nil
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: path, Attach: ebpf.AttachCGroupSockOps, Program: d.objs.VnatSockops})
	if err != nil {
		return fmt.Errorf("vnat: attach sockops to cgroup %s: %w", path, err)
	}
	d.links[name] = l
	return nil
}

// Translate makes connection v travel as p from now on, both ways, on
// this end; v already migrated moves to p. A moved remote end gets a /32
// route under its virtual address via its physical address's next hop.
func (d *Datapath) Translate(v Virtual, p Physical) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	write, stale, err := d.table.Set(v, p)
	if err != nil {
		return fmt.Errorf("vnat: translate: %w", err)
	}
	// The route is rewritten whenever this connection's peer moved:
	// the move may also have flushed it.
	d.resyncing = v.Remote != p.Remote
	err = d.syncRoutes(routeAddrs(v))
	d.resyncing = false
	if err != nil {
		d.table.Forget(v)
		return err
	}
	for _, e := range write {
		if err := d.objs.VnatXlate.Put(e.Key, e.Value); err != nil {
			d.table.Forget(v)
			return fmt.Errorf("vnat: write translation of %s: %w", v, err)
		}
	}
	for _, e := range stale {
		if err := d.objs.VnatXlate.Delete(e.Key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("vnat: delete old translation of %s: %w", v, err)
		}
	}
	return d.syncActive()
}

// TranslateBatch is Translate for many connections with one batched map
// update (paper §6.4: restoration must not grow per connection).
func (d *Datapath) TranslateBatch(ms []Migration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	keys := make([]XlateKey, 0, 2*len(ms))
	vals := make([]Rewrite, 0, 2*len(ms))
	var stale []XlateKey
	touched := map[netip.Addr]bool{}
	for _, m := range ms {
		for _, a := range routeAddrs(m.Virtual) {
			touched[a] = true
		}
		write, st, err := d.table.Set(m.Virtual, m.Physical)
		if err != nil {
			return fmt.Errorf("vnat: translate: %w", err)
		}
		for _, e := range write {
			keys = append(keys, e.Key)
			vals = append(vals, e.Value)
		}
		for _, e := range st {
			stale = append(stale, e.Key)
		}
	}
	vas := make([]netip.Addr, 0, len(touched))
	for a := range touched {
		vas = append(vas, a)
	}
	d.resyncing = true
	err := d.syncRoutes(vas)
	d.resyncing = false
	if err != nil {
		return err
	}
	if len(keys) > 0 {
		if _, err := d.objs.VnatXlate.BatchUpdate(keys, vals, nil); err != nil {
			return fmt.Errorf("vnat: write %d translations: %w", len(ms), err)
		}
	}
	for _, k := range stale {
		if err := d.objs.VnatXlate.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("vnat: delete old translation: %w", err)
		}
	}
	return d.syncActive()
}

// Resync writes the routes for moved peers again. Call it after the
// endpoint's addresses change: removing an interface's last address
// flushes every route through that interface.
func (d *Datapath) Resync() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.resyncing = true
	defer func() { d.resyncing = false }()
	return d.syncRoutes(nil)
}

// Forget stops translating v (its packets go out as the socket wrote them).
func (d *Datapath) Forget(v Virtual) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range d.table.Forget(v) {
		if err := d.objs.VnatXlate.Delete(e.Key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("vnat: forget %s: %w", v, err)
		}
	}
	if err := d.syncActive(); err != nil {
		return err
	}
	return d.syncRoutes(routeAddrs(v))
}

// syncActive writes the "anything migrated? any peer away?" words the
// programs read first.
func (d *Datapath) syncActive() error {
	cfg := vnatVnatConfig{Migrated: uint32(d.table.Len()), Helpers: uint32(len(d.away))}
	if err := d.objs.VnatState.Put(uint32(0), cfg); err != nil {
		return fmt.Errorf("vnat: write state: %w", err)
	}
	return nil
}

// syncRoutes makes the /32 routes for moved remote ends match the table,
// for the given virtual remote addresses (all of them when vas is nil).
// tc egress runs after the routing decision, so without a route the stack
// would resolve (ARP for) the peer's old address, which nobody answers.
// A wanted route is replaced even if installed when resyncing: removing an
// interface's last address flushes every route through it (the kernel's
// fib_disable_ip).
func (d *Datapath) syncRoutes(vas []netip.Addr) error {
	if vas == nil {
		for va := range d.table.RemoteRoutes() {
			vas = append(vas, va)
		}
		for va := range d.routes {
			vas = append(vas, va)
		}
	}
	for _, va := range vas {
		pa, want := d.table.RemoteRoute(va)
		have, installed := d.routes[va]
		switch {
		case want:
			if installed && have == pa && !d.resyncing {
				continue
			}
			if err := d.addRoute(va, pa); err != nil {
				return err
			}
			d.routes[va] = pa
		case installed:
			if err := d.delRoute(va); err != nil {
				return err
			}
			delete(d.routes, va)
		}
	}
	return nil
}

func (d *Datapath) addRoute(virt, phys netip.Addr) error {
	h, err := d.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	rs, err := h.RouteGet(phys.AsSlice())
	if err != nil || len(rs) == 0 {
		return fmt.Errorf("vnat: no route to %s (moved peer of %s): %v", phys, virt, err)
	}
	gw := rs[0].Gw
	if gw == nil {
		gw = phys.AsSlice() // on-link: the peer itself is the next hop
	}
	r := &netlink.Route{
		LinkIndex: rs[0].LinkIndex,
		Dst:       netipPrefix(virt),
		Gw:        gw,
		Protocol:  routeProto,
	}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("vnat: route %s via %s: %w", virt, gw, err)
	}
	return nil
}

func (d *Datapath) delRoute(virt netip.Addr) error {
	h, err := d.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	err = h.RouteDel(&netlink.Route{Dst: netipPrefix(virt), Protocol: routeProto})
	if err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("vnat: delete route %s: %w", virt, err)
	}
	return nil
}

// routeAddrs is the virtual remote address whose route a change of v may
// touch: its peer's (syncRoutes adds, keeps or removes that one route).
func routeAddrs(v Virtual) []netip.Addr { return []netip.Addr{v.Remote.Addr()} }

// routeProto marks VNAT's routes (`ip route show proto 203`).
const routeProto = 203

func netipPrefix(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}
}

// Counters are the datapath's counters, summed over CPUs, by name
// (enum vnat_counter in lower case without VNAT_).
func (d *Datapath) Counters() (map[string]uint64, error) {
	out := map[string]uint64{}
	for i, name := range d.counterNames {
		var per []uint64
		if err := d.objs.VnatCounters.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("vnat: read counter %s: %w", name, err)
		}
		var sum uint64
		for _, v := range per {
			sum += v
		}
		out[name] = sum
	}
	return out, nil
}

// Migrations lists the migrated connections.
func (d *Datapath) Migrations() []Migration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.table.Migrations()
}

// State of a connection as Connections reports it.
type State string

// States Connections reports.
const (
	StateActive   State = "active"   // recorded, never moved: not translated
	StateMigrated State = "migrated" // translated to a physical tuple
)

// Conn is one connection this endpoint knows.
type Conn struct {
	Virtual  Virtual
	Physical Physical // equal to Virtual unless migrated
	State    State
	TCPState string // TCP's own state (established, close_wait, ...), "" for UDP
	Source   string // "sockops", "sock_diag" or "translate"
	Cookie   uint64 // socket cookie when known
}

// Connections lists recorded connections (sockops and sock_diag) and the
// migrated ones, each once, sorted by virtual tuple.
func (d *Datapath) Connections() ([]Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	all := map[Tuple]Conn{}
	for t, c := range d.diag {
		all[t] = c
	}
	var k vnatVnatConnKey
	var v vnatVnatConn
	it := d.objs.VnatConns.Iterate()
	for it.Next(&k, &v) {
		t := Tuple{Proto: Proto(k.Proto),
			Local:  netip.AddrPortFrom(addrOf(k.Laddr), portOf(k.Lport)),
			Remote: netip.AddrPortFrom(addrOf(k.Raddr), portOf(k.Rport))}
		all[t] = Conn{Virtual: Virtual(t), Physical: Physical(t), State: StateActive,
			TCPState: tcpStateName(v.State), Source: "sockops", Cookie: v.Cookie}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("vnat: read recorded connections: %w", err)
	}
	for _, m := range d.table.Migrations() {
		c, ok := all[Tuple(m.Virtual)]
		if !ok {
			c = Conn{Virtual: m.Virtual, Source: "translate"}
		}
		c.Physical, c.State = m.Physical, StateMigrated
		all[Tuple(m.Virtual)] = c
	}
	out := make([]Conn, 0, len(all))
	for _, c := range all {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Virtual.String() < out[j].Virtual.String() })
	return out, nil
}

var tcpStates = []string{"", "established", "syn_sent", "syn_recv", "fin_wait1", "fin_wait2",
	"time_wait", "close", "close_wait", "last_ack", "listen", "closing", "new_syn_recv"}

func tcpStateName(s uint32) string {
	if int(s) < len(tcpStates) {
		return tcpStates[s]
	}
	return fmt.Sprintf("state(%d)", s)
}
