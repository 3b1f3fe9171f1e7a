package vnat

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/bpfobj"
	onehopns "github.com/onehop/onehop/internal/netns"
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
	// PinDir, on a bpffs, holds the maps (maps/) and links (links/) so
	// that translations outlive the process: a Kernel opened on a
	// PinDir where an earlier one pinned its maps takes them over, with
	// every migrated connection in them. "" pins nothing.
	PinDir string
}

// Kernel is VNAT loaded into the kernel for one endpoint: the programs,
// their maps, the links attaching them, and the migrated connections.
type Kernel struct {
	opts  Options
	objs  vnatObjects
	links *bpfobj.Links // pinned under PinDir/links when pinning

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
	// accepting are the ingress entries Accept wrote ahead of a
	// translation, by connection (accept.go).
	accepting map[Virtual]XlateKey
	// counterNames index vnat_counters (enum vnat_counter, from BTF).
	counterNames []string
}

// Open loads the programs and maps (nothing attached yet).
func Open(o Options) (*Kernel, error) {
	spec, err := loadVnat()
	if err != nil {
		return nil, fmt.Errorf("vnat: load spec: %w", err)
	}
	if o.XlateEntries > 0 {
		spec.Maps["vnat_xlate"].MaxEntries = o.XlateEntries
	}
	// "egress_translated", ... (enum vnat_counter, VNAT_COUNTER_MAX left out)
	names, err := bpfobj.EnumNames(spec, "vnat_counter", "VNAT_")
	if err != nil {
		return nil, fmt.Errorf("vnat: %w", err)
	}
	links := bpfobj.NewLinks("")
	if o.PinDir != "" {
		links = bpfobj.NewLinks(filepath.Join(o.PinDir, "links"))
	}
	d := &Kernel{opts: o, links: links, table: NewTable(),
		routes: map[netip.Addr]netip.Addr{}, kept: map[netip.Addr]bool{}, diag: map[Tuple]Conn{}, away: map[Virtual]bool{},
		counterNames: names}
	opts := &ebpf.CollectionOptions{}
	if o.PinDir != "" {
		if err := checkBPFFS(o.PinDir); err != nil {
			return nil, err
		}
		for _, m := range spec.Maps {
			if strings.HasPrefix(m.Name, "vnat_") {
				m.Pinning = ebpf.PinByName
			}
		}
		opts.Maps.PinPath = filepath.Join(o.PinDir, "maps")
		for _, sub := range []string{"maps", "links"} {
			if err := os.MkdirAll(filepath.Join(o.PinDir, sub), 0o700); err != nil {
				return nil, fmt.Errorf("vnat: pin dir: %w", err)
			}
		}
	}
	if err := spec.LoadAndAssign(&d.objs, opts); err != nil {
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("vnat: the maps pinned under %s are from another build (%w); `onehop vnat stop` the daemon that made them, or remove the directory (its translations stop)", opts.Maps.PinPath, err)
		}
		return nil, fmt.Errorf("vnat: load programs: %+v", err)
	}
	if o.PinDir != "" {
		if err := d.adopt(); err != nil {
			d.objs.Close()
			return nil, err
		}
	}
	return d, nil
}

// checkBPFFS says why dir (or the first of its parents that exists) is not on a bpffs.
func checkBPFFS(dir string) error {
	p := dir
	for {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			if st.Type != unix.BPF_FS_MAGIC {
				return fmt.Errorf("vnat: pin dir %s: %s is not on a bpffs (mount one: mount -t bpf bpf /sys/fs/bpf)", dir, p)
			}
			return nil
		}
		if !errors.Is(err, unix.ENOENT) || p == "/" {
			return fmt.Errorf("vnat: pin dir %s: %w", dir, err)
		}
		p = filepath.Dir(p)
	}
}

// IsBPFFS says whether dir (or the first of its parents that exists) is on a bpffs.
func IsBPFFS(dir string) bool { return checkBPFFS(dir) == nil }

// adopt takes over what pinned maps hold from an earlier run: the
// migrated connections (vnat_xlate's egress entries name both tuples) and
// their routes. Helper marks belong to the daemon that made them: they
// are cleared (a new daemon starts no helper it does not know about).
func (d *Kernel) adopt() error {
	var k XlateKey
	var v Rewrite
	it := d.objs.VnatXlate.Iterate()
	for it.Next(&k, &v) {
		if k.Dir != Egress {
			continue
		}
		vt := TupleOfKey(k)
		pt := Tuple{Proto: vt.Proto, Local: netip.AddrPortFrom(addrOf(v.Saddr), portOf(v.Sport)),
			Remote: netip.AddrPortFrom(addrOf(v.Daddr), portOf(v.Dport))}
		if _, _, err := d.table.Set(Virtual(vt), Physical(pt)); err != nil {
			return fmt.Errorf("vnat: pinned translation of %s: %w", vt, err)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("vnat: read pinned translations: %w", err)
	}
	var ck vnatVnatConnKey
	var cv vnatVnatHelper
	var stale []vnatVnatConnKey
	ai := d.objs.VnatAway.Iterate()
	for ai.Next(&ck, &cv) {
		stale = append(stale, ck)
	}
	if err := ai.Err(); err != nil {
		return fmt.Errorf("vnat: read pinned helper marks: %w", err)
	}
	for _, k := range stale {
		if err := d.objs.VnatAway.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("vnat: clear pinned helper mark: %w", err)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.syncActive(); err != nil {
		return err
	}
	d.resyncing = true
	defer func() { d.resyncing = false }()
	return d.syncRoutes(nil)
}

// Programs are the loaded programs, for BPF_PROG_RUN tests and benchmarks.
func (d *Kernel) Programs() (egress, ingress, sockops *ebpf.Program) {
	return d.objs.VnatEgress, d.objs.VnatIngress, d.objs.VnatSockops
}

// Close lets go of the datapath. Unpinned, it detaches everything,
// removes the routes it added and unloads the programs. Pinned
// (Options.PinDir), the pinned links keep the programs attached and the
// pinned maps keep every translation, and the routes stay: the next Open
// on the same PinDir takes them over. Remove takes pinned ones away.
func (d *Kernel) Close() error {
	if d.opts.PinDir != "" {
		var errs []error
		if err := d.links.Close(); err != nil {
			errs = append(errs, err)
		}
		if err := d.objs.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close vnat: %w", err))
		}
		return errors.Join(errs...)
	}
	return d.remove()
}

// Remove detaches everything, unpins the links and maps (removing
// PinDir), removes the routes it added and unloads the programs: every
// translation stops.
func (d *Kernel) Remove() error { return d.remove() }

func (d *Kernel) remove() error {
	var errs []error
	// Links of an earlier run this one never took over (another
	// interface) go too.
	names, err := d.links.Names()
	errs = append(errs, err)
	for _, name := range names {
		errs = append(errs, d.links.Detach(name))
	}
	d.mu.Lock()
	for va := range d.routes {
		if err := d.delRoute(va); err != nil {
			errs = append(errs, err)
		}
	}
	d.mu.Unlock()
	if d.opts.PinDir != "" {
		for _, m := range []*ebpf.Map{d.objs.VnatXlate, d.objs.VnatState, d.objs.VnatConns, d.objs.VnatAway, d.objs.VnatCounters} {
			if err := m.Unpin(); err != nil {
				errs = append(errs, fmt.Errorf("unpin map: %w", err))
			}
		}
		if err := os.RemoveAll(d.opts.PinDir); err != nil {
			errs = append(errs, fmt.Errorf("remove pin dir: %w", err))
		}
	}
	if err := d.objs.Close(); err != nil {
		errs = append(errs, fmt.Errorf("unload vnat: %w", err))
	}
	return errors.Join(errs...)
}

// handle is a netlink handle in the endpoint's namespace, for routes,
// addresses and sock_diag.
func (d *Kernel) handle() (*netlink.Handle, error) {
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
func (d *Kernel) AttachInterface(ifname string) error {
	return onehopns.DoPath(d.opts.Netns, func() error {
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
			if err := d.links.TCX(a.name, ifname, ifc.Attrs().Index, a.prog, a.at); err != nil {
				return fmt.Errorf("vnat: %w", err)
			}
		}
		return nil
	})
}

// AttachCgroup attaches the connection recorder (sockops) to a cgroup v2
// directory: TCP connections its processes establish from now on are
// recorded, and forgotten when they close.
func (d *Kernel) AttachCgroup(path string) error {
	name := "sockops" + path
	err := d.links.Attach(name, d.objs.VnatSockops, func(info *link.Info) bool { return info.Type == link.CgroupType }, func() (link.Link, error) {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: path, Attach: ebpf.AttachCGroupSockOps, Program: d.objs.VnatSockops})
		if err != nil {
			return nil, fmt.Errorf("attach sockops to cgroup %s: %w", path, err)
		}
		return l, nil
	})
	if err != nil {
		return fmt.Errorf("vnat: %w", err)
	}
	return nil
}

// Translate makes connection v travel as p from now on, both ways, on
// this end; v already migrated moves to p. A moved remote end gets a /32
// route under its virtual address via its physical address's next hop.
func (d *Kernel) Translate(v Virtual, p Physical) error {
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
	if err := d.settle(v); err != nil {
		return err
	}
	return d.syncActive()
}

// TranslateBatch is Translate for many connections with one batched map
// update (paper §6.4: restoration must not grow per connection). It is
// all or nothing: when any connection cannot be translated (a physical
// tuple another one has, a full map), every connection of the batch is
// left as it was before the call, in the table and in the map.
func (d *Kernel) TranslateBatch(ms []Migration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	keys := make([]XlateKey, 0, 2*len(ms))
	vals := make([]Rewrite, 0, 2*len(ms))
	var stale []XlateKey
	touched := map[netip.Addr]bool{}
	// undo is what the batch changed, to put back on failure.
	type undo struct {
		v   Virtual
		old Physical
		had bool
	}
	var undos []undo
	rollback := func(cause error) error {
		var errs []error
		for i := len(undos) - 1; i >= 0; i-- {
			u := undos[i]
			cur, _ := d.table.Lookup(u.v)
			if e, err := Entries(u.v, cur); err == nil {
				// The batch's ingress entry (keyed by the new physical
				// tuple) goes; the egress one is rewritten or goes.
				if err := d.objs.VnatXlate.Delete(e[1].Key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					errs = append(errs, err)
				}
				if !u.had {
					if err := d.objs.VnatXlate.Delete(e[0].Key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
						errs = append(errs, err)
					}
				}
			}
			if !u.had {
				d.table.Forget(u.v)
				continue
			}
			if _, _, err := d.table.Set(u.v, u.old); err != nil {
				errs = append(errs, err)
				continue
			}
			if e, err := Entries(u.v, u.old); err == nil {
				for _, en := range e {
					if err := d.objs.VnatXlate.Put(en.Key, en.Value); err != nil {
						errs = append(errs, err)
					}
				}
			}
		}
		d.resyncing = true
		if err := d.syncRoutes(keysOf(touched)); err != nil {
			errs = append(errs, err)
		}
		d.resyncing = false
		if err := d.syncActive(); err != nil {
			errs = append(errs, err)
		}
		if len(errs) > 0 {
			return fmt.Errorf("%w (and undoing the batch: %w)", cause, errors.Join(errs...))
		}
		return cause
	}
	for _, m := range ms {
		for _, a := range routeAddrs(m.Virtual) {
			touched[a] = true
		}
		old, had := d.table.Lookup(m.Virtual)
		write, st, err := d.table.Set(m.Virtual, m.Physical)
		if err != nil {
			return rollback(fmt.Errorf("vnat: translate: %w", err))
		}
		undos = append(undos, undo{m.Virtual, old, had})
		for _, e := range write {
			keys = append(keys, e.Key)
			vals = append(vals, e.Value)
		}
		for _, e := range st {
			stale = append(stale, e.Key)
		}
	}
	d.resyncing = true
	err := d.syncRoutes(keysOf(touched))
	d.resyncing = false
	if err != nil {
		return rollback(err)
	}
	// The old places' ingress entries go first: a batch that moves
	// connections then needs no room beyond what they had.
	for _, k := range stale {
		if err := d.objs.VnatXlate.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return rollback(fmt.Errorf("vnat: delete old translation: %w", err))
		}
	}
	if len(keys) > 0 {
		if _, err := d.objs.VnatXlate.BatchUpdate(keys, vals, nil); err != nil {
			return rollback(fmt.Errorf("vnat: write %d translations: %w", len(ms), err))
		}
	}
	var errs []error
	for _, m := range ms {
		errs = append(errs, d.settle(m.Virtual))
	}
	return errors.Join(append(errs, d.syncActive())...)
}

func keysOf(m map[netip.Addr]bool) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for a := range m {
		out = append(out, a)
	}
	return out
}

// Resync writes the routes for moved peers again. Call it after the
// endpoint's addresses change: removing an interface's last address
// flushes every route through that interface.
func (d *Kernel) Resync() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.resyncing = true
	defer func() { d.resyncing = false }()
	return d.syncRoutes(nil)
}

// Forget stops translating v (its packets go out as the socket wrote them).
func (d *Kernel) Forget(v Virtual) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range d.table.Forget(v) {
		if err := d.objs.VnatXlate.Delete(e.Key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("vnat: forget %s: %w", v, err)
		}
	}
	if err := d.settle(v); err != nil {
		return err
	}
	if err := d.syncActive(); err != nil {
		return err
	}
	return d.syncRoutes(routeAddrs(v))
}

// syncActive writes the "anything migrated? any peer away?" words the
// programs read first.
func (d *Kernel) syncActive() error {
	cfg := vnatVnatConfig{Migrated: uint32(d.table.Len() + len(d.accepting)), Helpers: uint32(len(d.away))}
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
func (d *Kernel) syncRoutes(vas []netip.Addr) error {
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

func (d *Kernel) addRoute(virt, phys netip.Addr) error {
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

func (d *Kernel) delRoute(virt netip.Addr) error {
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
func (d *Kernel) Counters() (map[string]uint64, error) {
	out, err := bpfobj.Counters(d.objs.VnatCounters, d.counterNames)
	if err != nil {
		return nil, fmt.Errorf("vnat: %w", err)
	}
	return out, nil
}

// Migrations lists the migrated connections.
func (d *Kernel) Migrations() []Migration {
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
func (d *Kernel) Connections() ([]Conn, error) {
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
	for v, p := range d.table.byVirtual { // sorted below, with the rest
		c, ok := all[Tuple(v)]
		if !ok {
			c = Conn{Virtual: v, Source: "translate"}
		}
		c.Physical, c.State = p, StateMigrated
		all[Tuple(v)] = c
	}
	out := make([]Conn, 0, len(all))
	for _, c := range all {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Conn) int { return compareTuples(Tuple(a.Virtual), Tuple(b.Virtual)) })
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
