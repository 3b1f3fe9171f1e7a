// Package lispdp is the in-kernel LISP data plane (RFC 9300): tcx programs
// that encapsulate IPv4 packets for EIDs into outer IPv4/UDP 4341/LISP and
// decapsulate them at the far end, and the Go API the access gateway and the
// data center's tunnel router (xTR) drive it with.
//
// A path is one tunnel: a local RLOC on one interface, a remote RLOC, the
// next hop's MAC. Encapsulation picks the path by the inner source address
// when it is pinned (one MPTCP subflow per path, paper 003 §2), else by the
// destination EID's mapping (the best-priority RLOCs, split by weight on a
// hash of the inner flow). Decapsulation accepts only packets from a known
// remote RLOC to a local one. docs/lisp-datapath.md has the maps and limits.
package lispdp

import (
	"net"
	"net/netip"
)

// MaxPaths is how many paths (tunnels) one datapath holds: a path id is a uint8.
const MaxPaths = 256

// Overhead is what encapsulation adds to an inner IPv4 packet: outer IPv4
// (20) + UDP (8) + LISP (8).
const Overhead = 36

// DataPort is the LISP data-plane UDP port (RFC 9300 §5.3).
const DataPort = 4341

// Unusable is the RLOC priority that means "do not use" (RFC 9301 §5.4).
const Unusable = 255

// Path is one tunnel from this node to a remote RLOC.
type Path struct {
	// Ifindex is the interface the encapsulated packets leave by (in the
	// datapath's namespace).
	Ifindex int
	// LocalRLOC is this node's address on that interface: the outer source,
	// and the outer destination decapsulation accepts.
	LocalRLOC netip.Addr
	// RemoteRLOC is the far xTR's locator: the outer destination, and the
	// only outer source decapsulation accepts for this path.
	RemoteRLOC netip.Addr
	// SrcMAC and DstMAC are the encapsulated frame's Ethernet addresses:
	// the interface's own and the next hop's towards RemoteRLOC. Without
	// DstMAC the kernel fills both: it looks RemoteRLOC up in the node's
	// routes out of Ifindex and resolves the next hop (bpf_redirect_neigh),
	// so the node needs a route to RemoteRLOC through that interface.
	SrcMAC, DstMAC net.HardwareAddr
	// InstanceID (24 bits) is sent with the I bit when UseInstanceID is set,
	// and then required on decapsulation; without it, a packet carrying a
	// non-zero instance id is refused.
	InstanceID    uint32
	UseInstanceID bool
	// MTU is the largest outer IPv4 packet the path carries (the WAN
	// interface's MTU). Nothing is ever fragmented: a GSO superpacket's
	// segments are cut to fit; any other packet that would exceed it once
	// encapsulated is answered with ICMP fragmentation needed (MTU - 36)
	// when it has DF (icmp_too_big), else dropped (too_big).
	MTU int
}

// PathChoice is one RLOC of an EID prefix's mapping, named by the path that
// reaches it, with the mapping's priority (lower is better, 255 unusable)
// and weight (share among equal priorities).
type PathChoice struct {
	ID       uint8
	Priority uint8
	Weight   uint8
}

// Stats counts one path's traffic. Tx is what was encapsulated onto it, Rx
// what was decapsulated from it; bytes are inner IPv4 bytes, packets count
// a GSO superpacket as its segments.
type Stats struct {
	TxPackets, TxBytes uint64
	RxPackets, RxBytes uint64
}

// Options say where the datapath runs.
type Options struct {
	// Netns is the path of the network namespace whose interfaces are
	// attached ("" = the caller's).
	Netns string
}

// RLOCOptions are AttachRLOCWith's per-interface choices.
type RLOCOptions struct {
	// WholeSuperpackets: the far end of this interface only terminates
	// what it decapsulates (an access gateway: each inner packet is for one
	// of its own TCP sockets; or an xTR whose site interfaces are veths into
	// server namespaces, attached with EIDOptions.WholeSuperpackets), so
	// TCP superpackets are sent whole, not segmented here. Its lisp_decap
	// strips a superpacket for such a socket whole even where the kernel
	// keeps the tunnel's GSO state (docs/lisp-datapath.md, GSO); one for
	// anything else it drops (drop_gso_decap). Do not set it towards a
	// node that forwards otherwise.
	WholeSuperpackets bool
}

// EIDOptions are AttachEIDWith's per-interface choices.
type EIDOptions struct {
	// WholeSuperpackets: the interface is a veth whose far end is a
	// namespace of this host that terminates the TCP it receives (a
	// server, as in the lab), so lisp_decap strips a TCP superpacket
	// routed out of it whole when an established socket of that namespace
	// owns it, even where the kernel keeps the tunnel's GSO state; the
	// gateways sending to this node may then send superpackets whole
	// (docs/lisp-datapath.md, GSO). Anything else is still dropped
	// (drop_gso_decap). Do not set it where the far end forwards.
	WholeSuperpackets bool
}
