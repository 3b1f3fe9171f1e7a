// Package tap is the virtual TAP (paper 002, §III–IV): copies of the
// traffic a policy names go to its monitor VM on any host, with no SPAN
// port and no encapsulation. Compile turns a node's TAP rules into the
// feature's map entries (pure); Sync writes them.
package tap

import (
	"net"
	"net/netip"

	"github.com/onehop/onehop/internal/intent"
)

// Plan is one node's TAP entries: what Compile makes and Sync writes.
type Plan struct {
	// Copy are the rules whose sender may be a local VM: the sender's
	// edge copies what matches.
	Copy []CopyRule
	// Recover are the rules whose monitor is local: the monitor's edge
	// takes copies from the fabric and hands them to the monitor.
	Recover []RecoverRule
	// Locals are the node's VMs: the sender's edge finds the rules a
	// packet can match by its sender, one of them.
	Locals []netip.Addr
	// Missing are the rules left out because their monitor cannot be
	// placed yet (Compile).
	Missing []MissingMonitor
	// UplinkIfindex is where copies to other hosts leave: the node's
	// uplink (feature.Node), 0 when it has none.
	UplinkIfindex int
}

// Match is what a rule matches, compiled.
type Match struct {
	ID       uint32 // intent.TapRule.ID
	Policy   string
	Sender   intent.TapEnd
	Receiver intent.TapEnd
	intent.TapFilter
}

// CopyRule is a rule at the sender's edge: where its copies go.
type CopyRule struct {
	Match
	MonitorIP netip.Addr
	// MonitorIfindex is the monitor's vif when it is on this node (0 if
	// not); MonitorHostMAC the uplink MAC of its host otherwise.
	MonitorIfindex int
	MonitorHostMAC net.HardwareAddr
	// Collector, when valid, is where the copies go instead of a monitor:
	// wrapped as Encap, out of the uplink (UplinkMAC, Source) to
	// CollectorMAC.
	Collector    netip.Addr
	Encap        string
	CollectorMAC net.HardwareAddr
	Source       netip.Addr
	UplinkMAC    net.HardwareAddr
}

// RecoverRule is a rule at the monitor's edge.
type RecoverRule struct {
	Match
	MonitorIP      netip.Addr
	MonitorIfindex int
}
