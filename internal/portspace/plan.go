// Package portspace is port-space isolation (paper 000, §3): slivers share
// their host's public IPv4 and MAC and are told apart by the port ranges
// they lease. Compile turns a node's slivers into the entries of the
// feature's maps (pure); Sync writes them; the feature's Run keeps each
// sliver's namespace confined to its lease.
package portspace

import (
	"net"
	"net/netip"
)

// Plan is one node's port-space entries: what Compile makes and Sync writes.
type Plan struct {
	// Uplinks are the node's public addresses, by uplink index.
	Uplinks []Uplink
	// Slivers are the node's slivers, by slot.
	Slivers []Sliver
	// Missing are the slivers left out because a link of theirs is not
	// there yet (Compile).
	Missing []MissingVif
}

// Uplink is one of the host's links to the fabric and the public address
// its slivers share.
type Uplink struct {
	Index   int
	Name    string
	Ifindex int
	Addr    netip.Addr
	MAC     net.HardwareAddr
}

// Sliver is one sliver: its slot, its links (one per uplink it leases on)
// and its leases.
type Sliver struct {
	Name   string
	Slot   uint32
	Vifs   []Vif
	Leases []Lease
}

// Vif is the host-side end of a sliver's link on one uplink.
type Vif struct {
	Uplink  int
	Name    string
	Ifindex int
}

// Lease is an inclusive port range on one uplink.
type Lease struct {
	Uplink int
	Lo, Hi uint16
}
