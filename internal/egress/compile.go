package egress

import (
	"fmt"
	"net/netip"
	"sort"

	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
)

// The maps egress reconciles and those the datapath owns
// (bpf/lib/egress_maps.h).
const (
	MapAddrs = "egress_addrs"
	MapPorts = "egress_ports"
	MapVMs   = "egress_vms"
	MapSlots = "egress_slots"
	MapTo    = "egress_to"
	MapState = "egress_state"
	MapFlows = "egress_flows"
	MapFrags = "egress_frags"
	// MapFragPlaces holds each VM's fragment records' keys, 16 places a
	// VM: its new record replaces its own older one, never another VM's.
	MapFragPlaces = "egress_frag_places"
	MapStats      = "egress_stats"
	MapCursors    = "egress_cursors"
	// MapPublished finds a published port from its VM's end (publish.h).
	MapPublished = "egress_published"
	portsPerU    = 65536
)

// VM is one egress VM of the node, as the datapath holds it: one with a
// slice (Slice.Lo > 0), or published ports, or both.
type VM struct {
	Name   string
	Addr   netip.Addr
	Slice  intent.Lease // zero for a VM without a slice
	To     []netip.Prefix
	Uplink feature.Uplink
	// Published are the VM's published ports (publish.h).
	Published []intent.Publication
	// Floating is the VM's floating address, or the zero Addr: it leaves
	// with it instead of a slice's port, and is reached on it whole.
	Floating netip.Addr
}

// HasSlice reports whether v holds a slice of its host's address.
func (v VM) HasSlice() bool { return v.Slice.Lo != 0 }

// leaves reports whether v's own flows leave the tenant space (it is in
// egress_vms): with a slice, or by its floating address. A VM with
// published ports only answers its clients and opens nothing.
func (v VM) leaves() bool { return v.HasSlice() || v.Floating.IsValid() }

// Plan is the node's egress entries: its host address (uplink 0's) and
// its egress VMs, by name. Slots are given in Sync, which keeps each VM's
// from pass to pass (its counters stay its own).
type Plan struct {
	Host netip.Addr
	VMs  []VM
}

// InUse implements feature.Plan: only a node with an egress VM runs the
// stage.
func (p Plan) InUse() bool { return len(p.VMs) > 0 }

// Sizes implements feature.Plan.
func (p Plan) Sizes() feature.Sizes {
	to, ports, vms, pub, addrs := 0, 0, 0, 0, 0
	for _, v := range p.VMs {
		to += len(v.To)
		if v.leaves() {
			vms++
		}
		if v.HasSlice() {
			ports += int(v.Slice.Hi) - int(v.Slice.Lo) + 1
		}
		ports += len(v.Published)
		pub += len(v.Published)
		if v.Floating.IsValid() {
			addrs++
		}
	}
	s := feature.Sizes{MapVMs: vms, MapSlots: len(p.VMs) + 1, MapTo: to, MapPorts: ports, MapPublished: pub}
	if p.InUse() {
		s[MapAddrs] = 1 + addrs
	}
	return s
}

// Compile turns the node's VMs with a slice or published ports into the
// plan. A VM's slice must lie in uplink 0's ports (the controller gives
// only such); a node whose uplink has no address yet has nothing to
// translate to.
func Compile(n feature.Node) (Plan, error) {
	var p Plan
	var up feature.Uplink
	for _, u := range n.Uplinks {
		if u.Index == 0 {
			up = u
		}
	}
	floating := map[netip.Addr]string{}
	for _, e := range n.Desired.Local {
		if e.Egress == nil && e.Floating == "" && len(e.Published) == 0 {
			continue
		}
		if !up.Addr.IsValid() {
			return p, fmt.Errorf("vm %s has an egress slice, published ports or a floating address but the node's uplink 0 has no address", e.Name)
		}
		addr, err := netip.ParseAddr(e.IP)
		if err != nil {
			return p, fmt.Errorf("vm %s: address %q: %w", e.Name, e.IP, err)
		}
		for _, pub := range e.Published {
			if (pub.Proto != "tcp" && pub.Proto != "udp") || pub.Port == 0 || pub.PublicPort == 0 {
				return p, fmt.Errorf("vm %s: publication %s: want tcp or udp and ports 1..65535", e.Name, pub)
			}
		}
		v := VM{Name: e.Name, Addr: addr, Uplink: up, Published: e.Published}
		if e.Egress == nil && e.Floating == "" {
			p.VMs = append(p.VMs, v)
			continue
		}
		// A floating address alone lets the VM out anywhere; its farm's
		// egress list, when it has egress, still applies.
		to := []string{"0.0.0.0/0"}
		if e.Egress != nil {
			sl := e.Egress.Slice
			if sl.Uplink != 0 || sl.Lo == 0 || sl.Lo > sl.Hi {
				return p, fmt.Errorf("vm %s: slice %d:%d-%d: want uplink 0 and 1 <= lo <= hi", e.Name, sl.Uplink, sl.Lo, sl.Hi)
			}
			v.Slice = sl
			if len(e.Egress.To) > 0 {
				to = e.Egress.To
			}
		}
		if e.Floating != "" {
			if v.Floating, err = floatingOf(n, e, up.Addr); err != nil {
				return p, err
			}
			if other, dup := floating[v.Floating]; dup {
				return p, fmt.Errorf("vm %s: floating address %s is vm %s's too", e.Name, v.Floating, other)
			}
			floating[v.Floating] = e.Name
		}
		for _, c := range to {
			pf, err := netip.ParsePrefix(c)
			if err != nil || !pf.Addr().Is4() {
				return p, fmt.Errorf("vm %s: destination %q: want an IPv4 prefix", e.Name, c)
			}
			v.To = append(v.To, pf.Masked())
		}
		p.VMs = append(p.VMs, v)
	}
	// Slices and published ports of one address never overlap (the
	// controller leases them); two that do here are a bug or a hand-made
	// record: refused whole.
	type held struct {
		name, what string
		l          intent.Lease
	}
	var hs []held
	for _, v := range p.VMs {
		if v.HasSlice() {
			hs = append(hs, held{v.Name, "slice", v.Slice})
		}
		for _, pub := range v.Published {
			hs = append(hs, held{v.Name, "published port", pub.Lease()})
		}
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].l.Lo < hs[j].l.Lo })
	for i := 1; i < len(hs); i++ {
		a, b := hs[i-1], hs[i]
		if b.l.Lo <= a.l.Hi {
			return p, fmt.Errorf("vm %s's %s %d-%d overlaps vm %s's %s %d-%d", b.name, b.what, b.l.Lo, b.l.Hi, a.name, a.what, a.l.Lo, a.l.Hi)
		}
	}
	sort.Slice(p.VMs, func(i, j int) bool { return p.VMs[i].Name < p.VMs[j].Name })
	if p.InUse() {
		p.Host = up.Addr
	}
	return p, nil
}

// floatingOf is e's floating address, checked: IPv4, outside the tenant
// space and not the host's own uplink address (the controller gives only
// such; a hand-made record is refused, naming the VM).
func floatingOf(n feature.Node, e intent.LocalEndpoint, host netip.Addr) (netip.Addr, error) {
	a, err := netip.ParseAddr(e.Floating)
	if err != nil || !a.Is4() {
		return a, fmt.Errorf("vm %s: floating address %q: want an IPv4 address", e.Name, e.Floating)
	}
	if a == host {
		return a, fmt.Errorf("vm %s: floating address %s is the host's own uplink address", e.Name, a)
	}
	if vmnet, err := netip.ParsePrefix(n.Desired.VMNet); err == nil && vmnet.Contains(a) {
		return a, fmt.Errorf("vm %s: floating address %s is in the tenant space %s", e.Name, a, vmnet)
	}
	return a, nil
}
