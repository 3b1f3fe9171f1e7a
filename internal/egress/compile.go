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
	portsPerU     = 65536
)

// VM is one egress VM of the node, as the datapath holds it.
type VM struct {
	Name   string
	Addr   netip.Addr
	Slice  intent.Lease
	To     []netip.Prefix
	Uplink feature.Uplink
}

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
	to, ports := 0, 0
	for _, v := range p.VMs {
		to += len(v.To)
		ports += int(v.Slice.Hi) - int(v.Slice.Lo) + 1
	}
	s := feature.Sizes{MapVMs: len(p.VMs), MapSlots: len(p.VMs) + 1, MapTo: to, MapPorts: ports}
	if p.InUse() {
		s[MapAddrs] = 1
	}
	return s
}

// Compile turns the node's VMs with a slice into the plan. A VM's slice
// must lie in uplink 0's ports (the controller gives only such); a node
// whose uplink has no address yet has nothing to translate to.
func Compile(n feature.Node) (Plan, error) {
	var p Plan
	var up feature.Uplink
	for _, u := range n.Uplinks {
		if u.Index == 0 {
			up = u
		}
	}
	for _, e := range n.Desired.Local {
		if e.Egress == nil {
			continue
		}
		if !up.Addr.IsValid() {
			return p, fmt.Errorf("vm %s has an egress slice but the node's uplink 0 has no address", e.Name)
		}
		addr, err := netip.ParseAddr(e.IP)
		if err != nil {
			return p, fmt.Errorf("vm %s: address %q: %w", e.Name, e.IP, err)
		}
		sl := e.Egress.Slice
		if sl.Uplink != 0 || sl.Lo == 0 || sl.Lo > sl.Hi {
			return p, fmt.Errorf("vm %s: slice %d:%d-%d: want uplink 0 and 1 <= lo <= hi", e.Name, sl.Uplink, sl.Lo, sl.Hi)
		}
		v := VM{Name: e.Name, Addr: addr, Slice: sl, Uplink: up}
		to := e.Egress.To
		if len(to) == 0 {
			to = []string{"0.0.0.0/0"}
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
	// Slices of one address never overlap (the controller leases them);
	// two that do here are a bug or a hand-made record: refused whole.
	byLo := append([]VM(nil), p.VMs...)
	sort.Slice(byLo, func(i, j int) bool { return byLo[i].Slice.Lo < byLo[j].Slice.Lo })
	for i := 1; i < len(byLo); i++ {
		a, b := byLo[i-1], byLo[i]
		if b.Slice.Lo <= a.Slice.Hi {
			return p, fmt.Errorf("vm %s's slice %d-%d overlaps vm %s's %d-%d", b.Name, b.Slice.Lo, b.Slice.Hi, a.Name, a.Slice.Lo, a.Slice.Hi)
		}
	}
	sort.Slice(p.VMs, func(i, j int) bool { return p.VMs[i].Name < p.VMs[j].Name })
	if p.InUse() {
		p.Host = up.Addr
	}
	return p, nil
}
