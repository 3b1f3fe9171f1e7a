package vnat

import (
	"fmt"
	"net/netip"
	"slices"
)

// XlateKey and Rewrite are vnat_xlate's key and value (bpf/lib/vnat_maps.h).
type (
	XlateKey = vnatVnatTuple
	Rewrite  = vnatVnatRewrite
)

// Directions of a vnat_xlate entry (enum vnat_dir).
const (
	Egress  = uint8(vnatVnatDirVNAT_EGRESS)
	Ingress = uint8(vnatVnatDirVNAT_INGRESS)
)

// Entry is one vnat_xlate entry.
type Entry struct {
	Key   XlateKey
	Value Rewrite
}

// Entries are the two vnat_xlate entries that translate the connection v,
// now at p, on this end: egress rewrites what the socket wrote (v) into
// what goes on the wire (p); ingress rewrites what arrives (p, reversed)
// into what the socket expects (v, reversed). Either end, or both, may
// have moved, and a physical port may differ from the virtual one.
func Entries(v Virtual, p Physical) ([2]Entry, error) {
	var out [2]Entry
	if err := validate(Tuple(v)); err != nil {
		return out, fmt.Errorf("virtual: %w", err)
	}
	if err := validate(Tuple(p)); err != nil {
		return out, fmt.Errorf("physical: %w", err)
	}
	if v.Proto != p.Proto {
		return out, fmt.Errorf("virtual %s and physical %s differ in protocol", v, p)
	}
	if Tuple(v) == Tuple(p) {
		return out, fmt.Errorf("connection %s: physical equals virtual, nothing to translate", v)
	}
	out[0] = Entry{
		Key: XlateKey{
			Saddr: be32(v.Local.Addr()), Daddr: be32(v.Remote.Addr()),
			Sport: be16(v.Local.Port()), Dport: be16(v.Remote.Port()),
			Proto: uint8(v.Proto), Dir: Egress,
		},
		Value: Rewrite{
			Saddr: be32(p.Local.Addr()), Daddr: be32(p.Remote.Addr()),
			Sport: be16(p.Local.Port()), Dport: be16(p.Remote.Port()),
		},
	}
	out[1] = Entry{
		Key: XlateKey{
			Saddr: be32(p.Remote.Addr()), Daddr: be32(p.Local.Addr()),
			Sport: be16(p.Remote.Port()), Dport: be16(p.Local.Port()),
			Proto: uint8(p.Proto), Dir: Ingress,
		},
		Value: Rewrite{
			Saddr: be32(v.Remote.Addr()), Daddr: be32(v.Local.Addr()),
			Sport: be16(v.Remote.Port()), Dport: be16(v.Local.Port()),
		},
	}
	return out, nil
}

// Table is the desired set of migrated connections on one endpoint: what
// vnat_xlate must hold. It refuses two connections that would share a
// physical tuple (their ingress packets could not be told apart).
type Table struct {
	byVirtual  map[Virtual]Physical
	byPhysical map[Physical]Virtual
	// remotes counts, per moved peer's virtual address, the connections
	// that reach it at each physical address: kept up to date on every
	// change so no call walks the table (paper §6.4's linear search).
	remotes map[netip.Addr]map[netip.Addr]int
}

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{byVirtual: map[Virtual]Physical{}, byPhysical: map[Physical]Virtual{},
		remotes: map[netip.Addr]map[netip.Addr]int{}}
}

// Set records that v is now at p, replacing where it was, and returns the
// entries to write and the entries the old location leaves stale (to
// delete). Setting p equal to v is Forget.
func (t *Table) Set(v Virtual, p Physical) (write [2]Entry, stale []Entry, err error) {
	write, err = Entries(v, p)
	if err != nil {
		return write, nil, err
	}
	if other, ok := t.byPhysical[p]; ok && other != v {
		return write, nil, fmt.Errorf("physical %s is already connection %s's", p, other)
	}
	old, had := t.byVirtual[v]
	if va, pa := v.Remote.Addr(), p.Remote.Addr(); va != pa {
		for at, n := range t.remotes[va] {
			if at != pa && n > 0 && !(had && n == 1 && old.Remote.Addr() == at) {
				return write, nil, fmt.Errorf("virtual remote %s is already at %s, not %s", va, at, pa)
			}
		}
	}
	if had && old != p {
		oldEntries, _ := Entries(v, old)
		stale = append(stale, oldEntries[1]) // egress key (v) is overwritten in place
		delete(t.byPhysical, old)
	}
	if had {
		t.countRemote(v, old, -1)
	}
	t.byVirtual[v] = p
	t.byPhysical[p] = v
	t.countRemote(v, p, +1)
	return write, stale, nil
}

// Forget drops v and returns its entries to delete (none if v was not migrated).
func (t *Table) Forget(v Virtual) []Entry {
	p, ok := t.byVirtual[v]
	if !ok {
		return nil
	}
	delete(t.byVirtual, v)
	delete(t.byPhysical, p)
	t.countRemote(v, p, -1)
	e, _ := Entries(v, p)
	return e[:]
}

// Len is the number of migrated connections.
func (t *Table) Len() int { return len(t.byVirtual) }

// Lookup says where v is, if it is migrated.
func (t *Table) Lookup(v Virtual) (Physical, bool) {
	p, ok := t.byVirtual[v]
	return p, ok
}

// Migration is one migrated connection.
type Migration struct {
	Virtual  Virtual
	Physical Physical
}

// Migrations lists the table in a stable order.
func (t *Table) Migrations() []Migration {
	out := make([]Migration, 0, len(t.byVirtual))
	for v, p := range t.byVirtual {
		out = append(out, Migration{v, p})
	}
	slices.SortFunc(out, func(a, b Migration) int { return compareTuples(Tuple(a.Virtual), Tuple(b.Virtual)) })
	return out
}

func (t *Table) countRemote(v Virtual, p Physical, delta int) {
	va, pa := v.Remote.Addr(), p.Remote.Addr()
	if va == pa {
		return
	}
	m := t.remotes[va]
	if m == nil {
		m = map[netip.Addr]int{}
		t.remotes[va] = m
	}
	m[pa] += delta
	if m[pa] <= 0 {
		delete(m, pa)
	}
	if len(m) == 0 {
		delete(t.remotes, va)
	}
}

// RemoteRoute says where the moved peer with virtual address va is, if
// any connection reaches it translated: tc egress runs after routing, so
// the stack must be able to route the peer's old address (internal/vnat
// installs va/32 via the physical address's next hop). Set refuses a
// peer at two places, so there is at most one.
func (t *Table) RemoteRoute(va netip.Addr) (netip.Addr, bool) {
	for pa := range t.remotes[va] {
		return pa, true
	}
	return netip.Addr{}, false
}

// RemoteRoutes are all of RemoteRoute's answers: virtual -> physical.
func (t *Table) RemoteRoutes() map[netip.Addr]netip.Addr {
	out := make(map[netip.Addr]netip.Addr, len(t.remotes))
	for va := range t.remotes {
		out[va], _ = t.RemoteRoute(va)
	}
	return out
}

// TupleOfKey reads a vnat_xlate key back (for listing and tests).
func TupleOfKey(k XlateKey) Tuple {
	return Tuple{
		Proto:  Proto(k.Proto),
		Local:  netip.AddrPortFrom(addrOf(k.Saddr), portOf(k.Sport)),
		Remote: netip.AddrPortFrom(addrOf(k.Daddr), portOf(k.Dport)),
	}
}
