package portspace

import (
	"fmt"
	"slices"
	"strings"

	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lease"
	"github.com/onehop/onehop/internal/limits"
)

// The feature's maps, by their names in bpf/lib/portspace_maps.h: what
// Sizes counts and the agent checks against their capacities.
const (
	MapUplinks = "portspace_uplinks" // uplink index -> the uplink (ifindex, MAC)
	MapAddrs   = "portspace_addrs"   // public IPv4 -> uplink index
	MapPorts   = "portspace_ports"   // (uplink, port) -> slot: one entry per leased port
	MapSlivers = "portspace_slivers" // slot -> the sliver (its leases, per-sliver state)
	MapVifs    = "portspace_vifs"    // host-side vif ifindex -> slot
	MapFanout  = "portspace_fanout"  // (uplink, i) -> vif: who gets a copy of what all slivers share (ARP replies)
	MapCgroups = "portspace_cgroups" // cgroup id -> slot (the sock_addr programs' confinement)
)

// The reconciled maps Sizes does not count: one entry per uplink (as
// MapUplinks), one for the whole host.
const (
	mapUplinkIndex = "portspace_uplink_index" // uplink index -> the uplink, for the sliver side
	mapConfig      = "portspace_config"       // the per-sliver share limits
)

// MissingVif is a sliver left out of a plan because the host-side end of
// one of its links does not exist yet (the lab or the operator has not
// plugged it in): the rest of the node's slivers are programmed without
// it, and the next pass takes it in once the link is there.
type MissingVif struct {
	Sliver string
	Ifname string
}

// Compile turns one node's slivers into the port-space plan: the node's
// uplinks that have an IPv4 address, and every sliver, by slot, with the
// ifindex of its link on each uplink it leases ports on. A sliver whose
// link is not there yet is listed in Plan.Missing instead of failing the
// plan. Pure and deterministic.
//
// It refuses (nothing of the plan is usable) what the controller never
// writes: a lease on an uplink the node does not have, two slivers on one
// slot or name, overlapping leases.
func Compile(n feature.Node) (Plan, error) {
	var p Plan
	have := map[int]bool{}
	for _, u := range n.Uplinks {
		if !u.Addr.Is4() {
			continue
		}
		if u.Index < 0 || u.Index >= limits.MaxUplinks {
			return Plan{}, fmt.Errorf("node %s: uplink %s has index %d: want 0..%d", n.Name, u.Name, u.Index, limits.MaxUplinks-1)
		}
		if have[u.Index] {
			return Plan{}, fmt.Errorf("node %s: two uplinks with index %d", n.Name, u.Index)
		}
		have[u.Index] = true
		p.Uplinks = append(p.Uplinks, Uplink{Index: u.Index, Name: u.Name, Ifindex: u.Ifindex, Addr: u.Addr, MAC: slices.Clone(u.MAC)})
	}
	slices.SortFunc(p.Uplinks, func(a, b Uplink) int { return a.Index - b.Index })

	slivers := slices.Clone(n.Desired.Slivers)
	slices.SortFunc(slivers, func(a, b intent.LocalSliver) int {
		if a.Slot != b.Slot {
			return int(a.Slot) - int(b.Slot)
		}
		return strings.Compare(a.Name, b.Name)
	})
	slots, names := map[uint32]string{}, map[string]bool{}
	var all []intent.Sliver // for the overlap check between slivers
	// lease.Overlap compares a sliver with every one before it: 0.1 s a
	// pass at 1,000 slivers, 1.4 s at 4,000. It is asked only when two
	// leases do share a port, to name them.
	overlaps := anyOverlap(slivers)
	for _, s := range slivers {
		if err := lease.CheckSliverName(s.Name); err != nil {
			return Plan{}, fmt.Errorf("node %s: %w", n.Name, err)
		}
		if s.Slot < 1 || s.Slot > limits.MaxSlivers {
			return Plan{}, fmt.Errorf("node %s: sliver %s has slot %d: want 1..%d", n.Name, s.Name, s.Slot, limits.MaxSlivers)
		}
		if other, dup := slots[s.Slot]; dup {
			return Plan{}, fmt.Errorf("node %s: slivers %s and %s share slot %d", n.Name, other, s.Name, s.Slot)
		}
		if names[s.Name] {
			return Plan{}, fmt.Errorf("node %s: sliver %s listed twice", n.Name, s.Name)
		}
		slots[s.Slot], names[s.Name] = s.Name, true
		leases := slices.Clone(s.Leases)
		lease.Sort(leases)
		if err := lease.Check(leases); err != nil {
			return Plan{}, fmt.Errorf("node %s: sliver %s: %w", n.Name, s.Name, err)
		}
		// Ephemeral range 1-0: empty; the controller checked the host's.
		if overlaps {
			if err := lease.Overlap(n.Name, s.Name, leases, all, 1, 0); err != nil {
				return Plan{}, fmt.Errorf("node %s: sliver %s: %w", n.Name, s.Name, err)
			}
		}
		all = append(all, intent.Sliver{Host: n.Name, Name: s.Name, Slot: s.Slot, Leases: leases})
	}

	for _, s := range all {
		sl := Sliver{Name: s.Name, Slot: s.Slot}
		var uplinks []int
		for _, l := range s.Leases {
			if !have[l.Uplink] {
				return Plan{}, fmt.Errorf("node %s: sliver %s leases %s on uplink %d, which the node does not have (it has %s)",
					n.Name, s.Name, lease.FormatOne(l), l.Uplink, uplinkList(p.Uplinks))
			}
			sl.Leases = append(sl.Leases, Lease{Uplink: l.Uplink, Lo: l.Lo, Hi: l.Hi})
			if !slices.Contains(uplinks, l.Uplink) {
				uplinks = append(uplinks, l.Uplink)
			}
		}
		missing := false
		for _, up := range uplinks {
			ifname := intent.SliverIfname(s.Name, up)
			var ifindex int
			var err error
			if n.Ifindex == nil {
				err = fmt.Errorf("no interface resolver")
			} else {
				ifindex, err = n.Ifindex(ifname)
			}
			if err != nil || ifindex <= 0 {
				p.Missing = append(p.Missing, MissingVif{Sliver: s.Name, Ifname: ifname})
				missing = true
				break
			}
			sl.Vifs = append(sl.Vifs, Vif{Uplink: up, Name: ifname, Ifindex: ifindex})
		}
		if !missing {
			p.Slivers = append(p.Slivers, sl)
		}
	}
	return p, nil
}

// anyOverlap reports whether two of the slivers' leases share a port on
// one uplink (two of one sliver's too, which lease.Check refuses): one
// sort and one sweep. Leases that are no range (lo > hi) share nothing.
func anyOverlap(slivers []intent.LocalSliver) bool {
	var spans []intent.Lease
	for _, s := range slivers {
		for _, l := range s.Leases {
			if l.Lo <= l.Hi {
				spans = append(spans, l)
			}
		}
	}
	slices.SortFunc(spans, func(a, b intent.Lease) int {
		if a.Uplink != b.Uplink {
			return a.Uplink - b.Uplink
		}
		return int(a.Lo) - int(b.Lo)
	})
	for i := 1; i < len(spans); i++ {
		if spans[i].Uplink == spans[i-1].Uplink && spans[i].Lo <= spans[i-1].Hi {
			return true
		}
		if spans[i].Uplink == spans[i-1].Uplink && spans[i].Hi < spans[i-1].Hi {
			spans[i].Hi = spans[i-1].Hi // the sweep carries the highest end so far
		}
	}
	return false
}

func uplinkList(us []Uplink) string {
	if len(us) == 0 {
		return "no uplink with an IPv4 address"
	}
	parts := make([]string, len(us))
	for i, u := range us {
		parts[i] = fmt.Sprintf("%d (%s)", u.Index, u.Name)
	}
	return "uplinks " + strings.Join(parts, ", ")
}

// Sizes is how many entries the plan puts in each map the feature
// reconciles. portspace_ports holds one entry per leased port (steering is one
// lookup whatever the number of leases); portspace_fanout one per sliver link.
func (p Plan) Sizes() feature.Sizes {
	ports, vifs := 0, 0
	for _, s := range p.Slivers {
		for _, l := range s.Leases {
			ports += int(l.Hi) - int(l.Lo) + 1
		}
		vifs += len(s.Vifs)
	}
	return feature.Sizes{
		MapUplinks: len(p.Uplinks),
		MapAddrs:   len(p.Uplinks),
		MapPorts:   ports,
		MapSlivers: len(p.Slivers),
		MapVifs:    vifs,
		MapFanout:  vifs,
		MapCgroups: len(p.Slivers),
	}
}

// InUse reports whether the node has a sliver to steer to: only then does
// the datapath run the port-space stage.
func (p Plan) InUse() bool { return len(p.Slivers) > 0 }
