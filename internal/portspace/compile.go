package portspace

// STUB for branch ps-dp only: the real Compile (and Sizes, InUse, the map
// names) is the ps-control helper's compile.go, which replaces this file
// at merge. It is here so the feature shell builds and its tests run.

import (
	"errors"

	"github.com/onehop/onehop/internal/feature"
)

// The feature's maps, by their names in bpf/lib/portspace_maps.h.
const (
	MapUplinks = "ps_uplinks"
	MapAddrs   = "ps_addrs"
	MapPorts   = "ps_ports"
	MapSlivers = "ps_slivers"
	MapVifs    = "ps_vifs"
	MapFanout  = "ps_fanout"
	MapCgroups = "ps_cgroups"
)

// Compile is the ps-control helper's (stub here).
func Compile(n feature.Node) (Plan, error) {
	return Plan{}, errors.New("portspace: compile is not in this branch")
}

// Sizes is how many entries the plan puts in each map it reconciles.
func (p Plan) Sizes() feature.Sizes {
	ports, vifs := 0, 0
	for _, s := range p.Slivers {
		for _, l := range s.Leases {
			ports += int(l.Hi) - int(l.Lo) + 1
		}
		vifs += len(s.Vifs)
	}
	return feature.Sizes{MapUplinks: len(p.Uplinks), MapAddrs: len(p.Uplinks), MapPorts: ports,
		MapSlivers: len(p.Slivers), MapVifs: vifs, MapFanout: vifs, MapCgroups: len(p.Slivers)}
}

// InUse reports whether the node has a sliver to steer to.
func (p Plan) InUse() bool { return len(p.Slivers) > 0 }
