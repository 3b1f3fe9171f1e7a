// Package feature is the one shape every datapath feature takes on the Go
// side (docs/architecture.md). A feature compiles one node's intent into its
// map entries (pure: no kernel, no store), syncs those entries into the maps
// it reconciles, and may own background work (a protocol socket, the slow
// path). The agent runs one sub-controller per registered feature: each is
// compiled, checked against its maps' capacities and synced on its own, so
// one feature's failure never stops another's.
//
// Maps come in two kinds. Reconciled maps hold exactly what Compile says
// and nothing else; the agent rewrites them from intent on every pass.
// Owned maps are the datapath's or a protocol's (conntrack, the mapping
// table, per-VM shares, counters, ring buffers): the agent never writes
// them from intent, and each has a bounded lifetime of its own, declared
// with the feature so the next person can see what ages how.
//
// This package imports nothing of the kernel or the store.
package feature

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"

	"github.com/onehop/onehop/internal/intent"
)

// Node is what a feature compiles from: one node's desired state and the
// facts of its host the entries depend on.
type Node struct {
	// Name is the node's name (the host's, as in the intent).
	Name    string
	Desired intent.Desired
	// Nodes are the store's node records: every host's uplink.
	Nodes []intent.Node
	// UplinkIfindex and UplinkMAC are the node's link to the fabric.
	UplinkIfindex int
	UplinkMAC     net.HardwareAddr
	// Uplinks are all of the node's links to the fabric, index 0 (the one
	// above) first; a multi-homed host has more.
	Uplinks []Uplink
	// Ifindex resolves an interface name in the node's namespace.
	Ifindex func(name string) (int, error)
	// LinkKind is the netlink kind of an interface ("veth", "tap" for a tun
	// device in tap mode, "tun", "macvtap", ...); nil: every guest's
	// interface is taken for a veth (tests and simulated hosts).
	LinkKind func(name string) (string, error)
	// Neighbor is the MAC of a neighbour on the fabric (a TAP collector)
	// as the node's uplink has resolved it; an error while it is not known
	// yet (asking starts resolving it). nil: no neighbour is known.
	Neighbor func(ip netip.Addr) (net.HardwareAddr, error)
}

// Uplink is one of the node's links to the fabric.
type Uplink struct {
	Index   int
	Name    string
	Ifindex int
	MAC     net.HardwareAddr
	Addr    netip.Addr
	Bits    int
}

// Sizes is how many entries a plan puts in each map it reconciles, by the
// map's name in the C.
type Sizes map[string]int

// Plan is a feature's compiled entries for one node. Only the feature
// reads its content; the agent reads its sizes (to check them against the
// maps' capacities before anything is written) and whether it is in use.
type Plan interface {
	Sizes() Sizes
	// InUse reports whether the node has any state of this feature: only
	// then is its bit set in node_config.features and its datapath stage
	// run.
	InUse() bool
}

// Feature is one datapath capability, registered once in the agent.
type Feature interface {
	// Name names the feature in logs, metrics and status.
	Name() string
	// Bit is the feature's bit in node_config.features (enum feature_bit in
	// bpf/lib/common.h); 0 for a feature whose stages always run (the
	// virtual router, the programs' core).
	Bit() uint32
	// Maps declares every map the feature's C defines: which it
	// reconciles and which the datapath or a protocol owns, with their
	// lifetimes.
	Maps() []Map
	// Compile turns the node's intent into the feature's entries. Pure
	// and deterministic: the same node always gives the same plan.
	Compile(n Node) (Plan, error)
	// Sync makes the feature's reconciled maps hold exactly p. It is
	// called only with a plan that fits (CheckFit).
	Sync(p Plan) error
}

// Runner is a feature with work of its own beside its maps (a protocol
// daemon, the slow path): Run until ctx ends.
type Runner interface {
	Run(ctx context.Context) error
}

// Reporter is a feature that adds its figures to the agent's status record.
type Reporter interface {
	Report(st *intent.AgentStatus)
}

// Loader is a feature with kernel objects of its own beside the router's
// (port space's programs): Load loads them once, when the agent is made,
// and an error stops the agent as a failed load of the router's does.
type Loader interface {
	Load() error
}

// Owner says who writes a map.
type Owner int

const (
	// Reconciled maps hold exactly what the feature's Compile says.
	Reconciled Owner = iota
	// Datapath maps are written by the programs (conntrack, the mapping
	// table, counters, ring buffers); the agent only reads or ages them.
	Datapath
	// Protocol maps are written by a protocol the agent runs (VCMP's
	// translations, LISP's map-cache): bounded by the protocol's timers.
	Protocol
)

func (o Owner) String() string {
	switch o {
	case Reconciled:
		return "reconciled"
	case Datapath:
		return "datapath"
	case Protocol:
		return "protocol"
	}
	return fmt.Sprintf("owner(%d)", int(o))
}

// Map declares one map of a feature.
type Map struct {
	Name  string
	Owner Owner
	// Lifetime says what bounds an entry of a map the agent does not
	// reconcile (an LRU, a timeout, the VM leaving): required for
	// Datapath and Protocol maps.
	Lifetime string
}

// Overflow is a map that cannot hold what a plan wants.
type Overflow struct {
	Map      string
	Want     int
	Capacity int
}

// OverflowError is a plan refused because some of its maps are too small.
// Nothing of the plan was written: the maps keep what they held.
type OverflowError struct {
	Feature   string
	Overflows []Overflow
}

func (e *OverflowError) Error() string {
	parts := make([]string, len(e.Overflows))
	for i, o := range e.Overflows {
		parts[i] = fmt.Sprintf("%s: %d entries wanted, capacity %d (%d did not fit)", o.Map, o.Want, o.Capacity, o.Want-o.Capacity)
	}
	return fmt.Sprintf("%s: map full, nothing written: %s", e.Feature, strings.Join(parts, "; "))
}

// CheckFit compares a plan's sizes with the maps' capacities (capacity
// returns how many entries a map takes for one plan; negative: unknown
// map). It returns an *OverflowError naming every map that does not fit,
// or an error for a map capacity does not know.
func CheckFit(feature string, want Sizes, capacity func(name string) int) error {
	names := make([]string, 0, len(want))
	for name := range want {
		names = append(names, name)
	}
	sort.Strings(names)
	var over []Overflow
	for _, name := range names {
		c := capacity(name)
		if c < 0 {
			return fmt.Errorf("%s: plan sizes map %q, which the datapath does not have", feature, name)
		}
		if want[name] > c {
			over = append(over, Overflow{Map: name, Want: want[name], Capacity: c})
		}
	}
	if len(over) > 0 {
		return &OverflowError{Feature: feature, Overflows: over}
	}
	return nil
}

// Overflows returns the overflows in err, if it is or wraps an
// *OverflowError.
func Overflows(err error) []Overflow {
	var oe *OverflowError
	if errors.As(err, &oe) {
		return oe.Overflows
	}
	return nil
}

// Check reports the first mistake in a registry: a feature without a name,
// two features with one name or one bit, a bit that is not a single bit, a
// map declared twice, an owned map without a lifetime.
func Check(fs []Feature) error {
	names := map[string]bool{}
	bits := uint32(0)
	maps := map[string]string{}
	for _, f := range fs {
		name := f.Name()
		if name == "" || names[name] {
			return fmt.Errorf("feature %q: empty or registered twice", name)
		}
		names[name] = true
		if b := f.Bit(); b != 0 {
			if b&(b-1) != 0 || bits&b != 0 {
				return fmt.Errorf("feature %s: bit %#x is not one bit of its own", name, b)
			}
			bits |= b
		}
		for _, m := range f.Maps() {
			if other, dup := maps[m.Name]; dup {
				return fmt.Errorf("map %s: declared by %s and %s", m.Name, other, name)
			}
			maps[m.Name] = name
			if m.Owner != Reconciled && m.Lifetime == "" {
				return fmt.Errorf("feature %s: map %s is %s-owned but says nothing of its lifetime", name, m.Name, m.Owner)
			}
		}
	}
	return nil
}
