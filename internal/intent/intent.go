// Package intent holds the records the controller and agents exchange through
// the store, and the keys they live under. Intent (hosts, farms, subnets, VMs)
// is written only by the controller; node records and agent status only by
// the agent of that node; desired state only by the controller.
package intent

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/ipam"
	"github.com/onehop/onehop/internal/version"
)

// Key prefixes in the store. Everything onehop keeps lives under Root, and
// every key's layout is written here (the desired state's in layout.go):
// no other package builds a key from pieces of its own.
const (
	Root = "/onehop/"
	// Prefix holds every intent record. The controller loads all of it
	// into its model and claims each kind of record under it
	// (controller/records.go): a kind added here needs its line there.
	Prefix        = Root + "intent/"
	HostsPrefix   = Prefix + "hosts/"   // + NAME
	FarmsPrefix   = Prefix + "farms/"   // + NAME
	SubnetsPrefix = Prefix + "subnets/" // + FARM/SUBNET (SubnetKey)
	VMsPrefix     = Prefix + "vms/"     // + FARM/SUBNET/VM (VMKey)
	SliversPrefix = Prefix + "slivers/" // + HOST/NAME (SliverKey)
	TapsPrefix    = Prefix + "taps/"    // + NAME
	// TapCapturesPrefix holds the running captures of TAP policies (+
	// NAME, the policy's): onehop tap capture, while it runs.
	TapCapturesPrefix = Prefix + "tapcaptures/"
	// AllocKey holds the farm and subnet ids (ipam.Allocations without
	// its VMs); a store of before also holds every VM's id there.
	AllocKey = Prefix + "allocations"
	// VMIDsPrefix holds, per subnet (+ FARM/SUBNET), the host ids its VMs
	// hold: the VM part of the allocations, one small key per subnet, so
	// that creating a VM rewrites at most 253 entries rather than every
	// VM's.
	VMIDsPrefix = Prefix + "vmids/"
	NodesPrefix = Root + "nodes/"
	// LeaseSpacesPrefix holds each host's lease space (+ HOST/, see
	// LeaseSpaceKey): every writer of a lease of a host's address writes
	// it too, in one transaction, and only if it is unchanged since it
	// read it. Not intent: it orders writers and compiles into nothing.
	LeaseSpacesPrefix = Root + "leasespaces/"
	// ObservePrefix holds the running onehop observe streams (+ ID, an
	// observe.Subscription): every agent reads them and publishes its
	// events to the ones that want them. Not intent: nothing compiles it.
	ObservePrefix = Root + "observe/"
	DesiredPrefix = Root + "desired/"
	StatusPrefix  = Root + "status/"
	// LISPMappingsPrefix holds the map-server's mappings, one key per EID
	// prefix (LISPMappingKey). Not intent: a registration refreshes them
	// often and recompiles nothing.
	LISPMappingsPrefix = Root + "lisp/mappings/"
	// FloatingPrefix holds the operator's pool of floating addresses:
	// + ADDRESS, a FloatingAddress. Outside Prefix: the pool compiles into
	// nothing; the VM a pool address is attached to carries it
	// (VM.Floating) into its host's desired state.
	FloatingPrefix = Root + "floating/"
	// VNATLocationsPrefix holds the VNAT location records
	// (vnatloc.Prefix). Not intent either: a refresh is not an intent
	// change.
	VNATLocationsPrefix = Root + "vnat/locations/"
	// TenantTokensPrefix holds the tenant tokens (+ ID), each with the
	// SHA-256 of its secret, never the secret (docs/tenants.md). Not
	// intent: only the controller reads it; no agent needs it.
	TenantTokensPrefix = TenantsPrefix + "tokens/"
	// TenantCertRevocationsPrefix holds the revoked tenant certificates:
	// "serial/HEX" one certificate, "farm/FARM" every certificate of the
	// farm issued until then (docs/tenants.md). Only the controller reads it.
	TenantCertRevocationsPrefix = TenantsPrefix + "cert-revocations/"
	// TenantsPrefix holds what a controller checks tenants' credentials
	// against; it watches the whole of it.
	TenantsPrefix = Root + "tenants/"
	// AuditPrefix holds the audit trail, one key per accepted write (+ a
	// sortable id), the oldest dropped first (docs/tenants.md).
	AuditPrefix = Root + "audit/"
	// PlanKey holds the cloud's address plan (addrplan.Plan), chosen when
	// the cloud is created and read by every daemon at start; absent, the
	// default 10.f.s.h.
	PlanKey = Root + "plan"
)

// SubnetKey is the key of subnet farm/subnet.
func SubnetKey(farm, subnet string) string { return SubnetsPrefix + farm + "/" + subnet }

// VMKey is the key of VM farm/subnet/vm.
func VMKey(farm, subnet, vm string) string { return VMsPrefix + farm + "/" + subnet + "/" + vm }

// HostLeaseSpacePrefix is the prefix of host's lease space key: what a
// lease's writer compares (a prefix compare that takes in no other host's).
func HostLeaseSpacePrefix(host string) string { return LeaseSpacesPrefix + host + "/" }

// LeaseSpaceKey holds host's LeaseSpace.
func LeaseSpaceKey(host string) string { return HostLeaseSpacePrefix(host) + "claims" }

// HostSliversPrefix is the prefix of every sliver of host.
func HostSliversPrefix(host string) string { return SliversPrefix + host + "/" }

// SliverKey is the key of sliver name of host.
func SliverKey(host, name string) string { return HostSliversPrefix(host) + name }

// LISPMappingKey is the key of the mapping of EID prefix p: its text with
// the "/" made "_" ("10.99.0.0_16"), so that a key is one path segment.
func LISPMappingKey(p netip.Prefix) string {
	return LISPMappingsPrefix + strings.Replace(p.String(), "/", "_", 1)
}

// Host is a physical server that may run an agent.
type Host struct {
	Name    string `json:"name"`
	Address string `json:"address"` // its IPv4 on the fabric
}

// Farm is one tenant network; ID is the f of 10.f.s.h.
type Farm struct {
	Name  string   `json:"name"`
	ID    uint16   `json:"id"`
	Peers []string `json:"peers,omitempty"` // farms this farm agrees to talk to
	Rules []Rule   `json:"rules,omitempty"` // what its owner allows between subnets
	// LastRuleID is the highest rule id the farm has given: ids are never
	// given twice, so a stale `rule delete FARM ID` cannot hit a newer rule.
	LastRuleID uint32 `json:"lastRuleID,omitempty"`
	// ProxyARP makes the datapath answer a VM's ARP for another subnet with
	// its gateway's MAC (for guests configured with a wider netmask).
	ProxyARP bool `json:"proxyARP,omitempty"`
	// Egress lets the farm's VMs reach addresses outside the tenant space
	// through their host's address (docs/north-south.md); nil: off.
	Egress *FarmEgress `json:"egress,omitempty"`
}

// Rule allows traffic from one subnet to another ("farm/subnet" each). Proto
// is tcp, udp, icmp or "" for any; Port (tcp/udp destination) 0 is any.
// Replies of allowed flows pass without a rule of their own.
type Rule struct {
	// ID names the rule within its farm (NumberRules): given by the
	// controller, never changed by another rule's delete.
	ID    uint32 `json:"id,omitempty"`
	From  string `json:"from"`
	To    string `json:"to"`
	Proto string `json:"proto,omitempty"`
	Port  uint16 `json:"port,omitempty"`
}

// VisRule is a compiled rule: subnet ids and an IP protocol number.
type VisRule struct {
	SrcFarm   uint16 `json:"srcFarm"`
	SrcSubnet uint16 `json:"srcSubnet"`
	DstFarm   uint16 `json:"dstFarm"`
	DstSubnet uint16 `json:"dstSubnet"`
	Proto     uint8  `json:"proto"`
	Port      uint16 `json:"port"`
}

// Subnet is one subnet of a farm (a /24 in the default plan); ID is the s
// of 10.f.s.h.
type Subnet struct {
	Farm    string `json:"farm"`
	Name    string `json:"name"`
	ID      uint16 `json:"id"`
	Prefix  string `json:"prefix"`
	Gateway string `json:"gateway"`
	// Egress is the subnet's own egress setting, which overrides its
	// farm's; nil: the farm's (EffectiveEgress).
	Egress *SubnetEgress `json:"egress,omitempty"`
}

// VM is one guest with its allocated address and virtual MAC.
type VM struct {
	Farm      string    `json:"farm"`
	Subnet    string    `json:"subnet"`
	Name      string    `json:"name"`
	Host      string    `json:"host"`
	Interface string    `json:"interface"` // its vif on the host
	IP        string    `json:"ip"`
	MAC       string    `json:"mac"`
	Gateway   string    `json:"gateway"`
	Firewall  *Firewall `json:"firewall,omitempty"`
	// Former are the addresses the VM had before moves to other subnets,
	// the most recent last, at most MaxFormer: its VNAT connections may
	// still use them virtually, and the location server lets only it
	// claim them (docs/vnat-location.md).
	Former []string `json:"former,omitempty"`
	// Egress is the VM's slice of its host's address, while its farm has
	// egress on; a move takes a new slice on the new host.
	Egress *VMEgress `json:"egress,omitempty"`
	// Container is the CNI attachment the VM was made for (docs/guests.md),
	// which the plugin's GC compares with the runtime's valid attachments;
	// nil for every other VM, which GC never touches.
	Container *VMContainer `json:"container,omitempty"`
	// Published are the VM's ports reached from outside on ports of its
	// host's uplink-0 address (`onehop vm publish`, docs/north-south.md):
	// leases of that address, as slices are; a move takes them to the new
	// host's address, with the same public ports.
	Published []Publication `json:"published,omitempty"`
	// Floating is the floating address attached to the VM (onehop
	// floating attach), or empty; it moves with the VM.
	Floating string `json:"floating,omitempty"`
}

// VMContainer names a CNI attachment: the network config's name, the
// container's id and its interface name in the container.
type VMContainer struct {
	Network string `json:"network"`
	ID      string `json:"id"`
	IfName  string `json:"ifname"`
}

// maxContainerField bounds a VMContainer's network and id (CNI sets no
// length; runtimes' ids are 64 hex digits).
const maxContainerField = 256

// Check says what is wrong with c, naming its field under field.
func (c VMContainer) Check(field string) error {
	for _, f := range []struct{ name, val string }{{"network", c.Network}, {"id", c.ID}} {
		if f.val == "" || len(f.val) > maxContainerField {
			return fmt.Errorf("%s.%s: want 1 to %d bytes, got %d", field, f.name, maxContainerField, len(f.val))
		}
		if i := strings.IndexFunc(f.val, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
		}); i >= 0 {
			return fmt.Errorf("%s.%s %q: only letters, digits, '-', '_' and '.' (as CNI allows), not %q at %d", field, f.name, f.val, f.val[i], i)
		}
	}
	return CheckInterface(field+".ifname", c.IfName)
}

// FloatingAddress is one address of the operator's pool of floating
// addresses (docs/north-south.md): a fabric address a VM is reached on
// whole and leaves by, wherever it lives. VM is the VM it was last
// attached to; it holds the address only while that VM's own record says
// so (VM.Floating), so a VM deleted or detached half way frees it.
type FloatingAddress struct {
	Address string `json:"address"`
	VM      string `json:"vm,omitempty"` // FARM/SUBNET/VM
	// Host is where the VM lives, filled in when the pool is listed.
	Host string `json:"host,omitempty"`
}

// MaxFormer bounds VM.Former.
const MaxFormer = 4

// Firewall is a VM's own, customer-set firewall: ordered rules per
// direction, first match wins, else the direction's default. Stateful:
// replies to flows it admitted always pass.
type Firewall struct {
	DefaultIn  string         `json:"defaultIn"`  // allow or deny
	DefaultOut string         `json:"defaultOut"` // allow or deny
	Rules      []FirewallRule `json:"rules"`
	// LastRuleID is the highest rule id this firewall has given.
	LastRuleID uint32 `json:"lastRuleID,omitempty"`
}

// FirewallRule matches traffic into (in) or out of (out) the VM.
type FirewallRule struct {
	// ID names the rule within its VM's firewall (NumberRules), as Rule.ID.
	ID     uint32 `json:"id,omitempty"`
	Dir    string `json:"dir"`             // in or out
	Proto  string `json:"proto,omitempty"` // tcp, udp, icmp; "" any
	PortLo uint16 `json:"portLo,omitempty"`
	PortHi uint16 `json:"portHi,omitempty"` // VM-side port for in, remote port for out
	CIDR   string `json:"cidr,omitempty"`   // the remote end; "" any
	Action string `json:"action"`           // allow or deny
}

// VifPrefix starts the name of every VM's default interface (VifName).
const VifPrefix = "vif-"

// MaxIfname is the longest interface name Linux takes (IFNAMSIZ less its
// terminating NUL).
const MaxIfname = 15

// VifName is the default host-side interface of farm's VM vm: vif-, the
// VM's name (its first VifNameRoom bytes), '-' and five hex digits of a hash
// of FARM/VM. VM names are unique within a farm only, so blue/web1 and
// red/web1 may share a host: the hash of the farm keeps their interfaces
// apart, and the name stays a pure function of the VM (the CNI plugin's DEL
// derives it without asking the controller) within MaxIfname. A VM keeps the
// interface it was created with: its record holds it (VM.Interface), so the
// VMs of a cloud made before this name was derived keep their vif-VM.
func VifName(farm, vm string) string {
	sum := sha256.Sum256([]byte(farm + "/" + vm))
	if len(vm) > VifNameRoom {
		vm = vm[:VifNameRoom]
	}
	return VifPrefix + vm + "-" + hex.EncodeToString(sum[:3])[:5]
}

// VifNameRoom is how many bytes of a VM's name its default interface
// keeps (VifName): MaxIfname less the prefix and "-" and five hex digits.
const VifNameRoom = MaxIfname - len(VifPrefix) - 6

// CheckInterface checks a guest's host interface name as Linux would
// (dev_valid_name): 1 to MaxIfname bytes, no '/', ':' or whitespace, not
// "." or "..". The error names the field, for the CLI's flag and the API's
// field alike.
func CheckInterface(field, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%s: an interface name must not be empty", field)
	case len(name) > MaxIfname:
		return fmt.Errorf("%s %q: an interface name has at most %d bytes, this one %d", field, name, MaxIfname, len(name))
	case name == "." || name == "..":
		return fmt.Errorf("%s %q: not an interface name", field, name)
	case strings.ContainsAny(name, "/:") || strings.IndexFunc(name, unicode.IsSpace) >= 0 || strings.IndexFunc(name, unicode.IsControl) >= 0:
		return fmt.Errorf("%s %q: an interface name has no '/', ':', whitespace or control characters", field, name)
	}
	return nil
}

// NewVM is the one way a VM record is made from its allocated address: the
// virtual MAC, gateway and vif all follow from it (the vif from its farm
// and name: VifName).
func NewVM(farm, subnet, name, host string, ip netip.Addr) VM {
	return VM{Farm: farm, Subnet: subnet, Name: name, Host: host, Interface: VifName(farm, name),
		IP: ip.String(), MAC: ipam.VirtualMAC(ip).String(), Gateway: addrplan.Current().GatewayOf(ip).String()}
}

// FullName is farm/subnet/vm, the VM's unique name in the cloud (its
// name alone is unique only within its farm).
func (v VM) FullName() string { return v.Farm + "/" + v.Subnet + "/" + v.Name }

// Node is what an agent reports about its host: the uplink other hosts must
// address frames to. Hosts never ARP for each other; this record replaces it.
type Node struct {
	Name      string `json:"name"`
	Uplink    string `json:"uplink"`
	UplinkMAC string `json:"uplinkMAC"`
	UplinkIP  string `json:"uplinkIP"`
	// Uplinks lists every link of the host to the fabric, index 0 first (the
	// one above); a multi-homed host has more (paper §3.3d). Empty from an
	// agent that predates them: then Uplink* is the only one.
	Uplinks []NodeUplink `json:"uplinks,omitempty"`
	// EphemeralLo/Hi are the host's own net.ipv4.ip_local_port_range: no
	// sliver may lease a port in it. 0/0: not reported yet.
	EphemeralLo uint16 `json:"ephemeralLo,omitempty"`
	EphemeralHi uint16 `json:"ephemeralHi,omitempty"`
}

// NodeUplink is one of a host's links to the fabric and its public address.
type NodeUplink struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	MAC   string `json:"mac"`
	IP    string `json:"ip"`
	Bits  int    `json:"bits"` // the fabric prefix length
}

// Sliver is a guest that shares its host's public IPv4 and MAC and is told
// apart from the host and the other slivers by the ports it leases
// (port-space isolation). Its name is unique on its host (HOST/NAME).
type Sliver struct {
	Host string `json:"host"`
	Name string `json:"name"`
	// Slot is the sliver's number on its host (1..limits.Slivers), allocated
	// by the controller and never changed while the sliver lives: the
	// datapath's per-sliver state and counters are indexed by it.
	Slot   uint32  `json:"slot"`
	Leases []Lease `json:"leases"`
}

// FullName is HOST/NAME.
func (s Sliver) FullName() string { return s.Host + "/" + s.Name }

// Uplinks are the uplinks the sliver leases ports on, ascending: it has a
// link (eth<k>) on each.
func (s Sliver) Uplinks() []int {
	var out []int
	for _, l := range s.Leases {
		if !slices.Contains(out, l.Uplink) {
			out = append(out, l.Uplink)
		}
	}
	slices.Sort(out)
	return out
}

// Lease is an inclusive port range on one of the host's uplinks, for TCP,
// UDP and ICMP echo ids alike.
type Lease struct {
	Uplink int    `json:"uplink"`
	Lo     uint16 `json:"lo"`
	Hi     uint16 `json:"hi"`
}

// SliverIfname is the host-side end of a sliver's link on an uplink: the
// sliver's own end is eth<uplink>.
func SliverIfname(sliver string, uplink int) string {
	return "s" + strconv.Itoa(uplink) + "-" + sliver
}

// LocalSliver is a sliver on the node itself, as its agent needs it.
type LocalSliver struct {
	Name   string  `json:"name"`
	Slot   uint32  `json:"slot"`
	Leases []Lease `json:"leases"`
}

// SliverStats is one sliver's traffic as its host's datapath counted it.
type SliverStats struct {
	Name       string            `json:"name"`
	PacketsIn  uint64            `json:"packetsIn"`
	PacketsOut uint64            `json:"packetsOut"`
	BytesIn    uint64            `json:"bytesIn"`
	BytesOut   uint64            `json:"bytesOut"`
	Drops      map[string]uint64 `json:"drops,omitempty"` // by reason
	// Cut counts the sliver's connections cut because a lease change took
	// their ports away.
	Cut uint64 `json:"cut,omitempty"`
}

// LocalEndpoint is a VM on the node itself.
type LocalEndpoint struct {
	Name      string    `json:"name"`
	IP        string    `json:"ip"`
	MAC       string    `json:"mac"`
	Interface string    `json:"interface"`
	Firewall  *Firewall `json:"firewall,omitempty"`
	// Egress is the VM's slice of its host's address and where it may go
	// (docs/north-south.md); nil: the VM reaches nothing outside.
	Egress *VMEgress `json:"egress,omitempty"`
	// Published are the VM's published ports (VM.Published).
	Published []Publication `json:"published,omitempty"`
	// Floating is the VM's floating address, or empty: the host steers it
	// whole to the VM and answers ARP for it (docs/north-south.md).
	Floating string `json:"floating,omitempty"`
}

// Desired is everything one node's datapath must hold. It is complete, not a
// delta: an agent that applies it from scratch ends in the same state as one
// that has applied every earlier version. Where other hosts' VMs live is not
// in it: each host's ARP engine learns that on demand (paper §2), so a
// node's desired state grows with its own VMs, not with the cluster.
type Desired struct {
	Node  string          `json:"node"`
	VMNet string          `json:"vmNet"`
	Local []LocalEndpoint `json:"local"`
	// Visibility lists what may cross between subnets; within a subnet
	// everything may.
	Visibility []VisRule `json:"visibility"`
	// ProxyARPFarms lists the ids of farms that enabled proxy ARP.
	ProxyARPFarms []uint16 `json:"proxyARPFarms,omitempty"`
	// Slivers are the node's slivers and their leases (port-space).
	Slivers []LocalSliver `json:"slivers,omitempty"`
	// Taps are the TAP rules this node plays a part in: as the sender's
	// edge (a local VM may match the rule's sender) or the monitor's edge
	// (the monitor is local).
	Taps []TapRule `json:"taps,omitempty"`
}

// TapPolicy is an operator's virtual TAP (paper 002, §III): copies of what
// Sender sends Receiver that pass the filters go to Monitor. One direction;
// BothDirections adds the reverse as a rule of its own.
type TapPolicy struct {
	Name string `json:"name"`
	// ID is allocated by the controller, stable while the policy lives:
	// the datapath's counters and rules are keyed by it (1..limits).
	ID       uint32 `json:"id"`
	Sender   string `json:"sender"`            // farm/subnet/vm, farm/subnet or any (IP or MAC of a VM resolved by the controller)
	Receiver string `json:"receiver"`          // the same forms
	Monitor  string `json:"monitor,omitempty"` // farm/subnet/vm; empty with a Collector
	// Collector is an address on the fabric the copies go to instead of a
	// monitor VM, encapsulated as Encap (docs/tap.md).
	Collector string `json:"collector,omitempty"`
	Encap     string `json:"encap,omitempty"` // with a Collector: erspan2 (the default), erspan3 or gre
	TapFilter
	BothDirections bool `json:"bothDirections,omitempty"`
	// CrossFarm lets the monitor sit in a farm other than the sender's
	// or receiver's, which must also peer with it.
	CrossFarm bool `json:"crossFarm,omitempty"`
}

// TapFilter is a policy's optional filters; zero values match anything.
type TapFilter struct {
	Proto   uint8  `json:"proto,omitempty"` // IP protocol number; 0 any
	SportLo uint16 `json:"sportLo,omitempty"`
	SportHi uint16 `json:"sportHi,omitempty"`
	DportLo uint16 `json:"dportLo,omitempty"`
	DportHi uint16 `json:"dportHi,omitempty"`
	// VLAN is the paper's VLAN ID. An onehop network is a subnet, not a
	// VLAN: N matches packets whose sender's subnet is segment N =
	// farm*256 + subnet (docs/tap.md); 0 any.
	VLAN uint16 `json:"vlan,omitempty"`
}

// TapEnd is a compiled sender or receiver: one VM, one subnet or any.
// Kind any is any VM of farm Farm (the monitor's farm: a monitor sees only
// its own farm's traffic, internal/tappolicy), never any address at all.
type TapEnd struct {
	Kind   string `json:"kind"`             // vm, subnet or any
	IP     string `json:"ip,omitempty"`     // kind vm
	Farm   uint16 `json:"farm,omitempty"`   // kind subnet, and kind any (any VM of this farm)
	Subnet uint16 `json:"subnet,omitempty"` // kind subnet
}

// TapRule is one direction of a policy, as a node's datapath needs it.
type TapRule struct {
	ID       uint32 `json:"id"`     // the policy's ID; the reverse of a two-way policy is ID|TapReverse
	Policy   string `json:"policy"` // its name, for stats and logs
	Sender   TapEnd `json:"sender"`
	Receiver TapEnd `json:"receiver"`
	TapFilter
	// MonitorIP is the monitor VM; MonitorHost the node that holds it.
	// Both are empty when the copies go to a Collector.
	MonitorIP   string `json:"monitorIP,omitempty"`
	MonitorHost string `json:"monitorHost,omitempty"`
	// Collector is the fabric address the copies go to, encapsulated as
	// Encap (erspan2, erspan3 or gre), with the policy's id as the ERSPAN
	// session.
	Collector string `json:"collector,omitempty"`
	Encap     string `json:"encap,omitempty"`
}

// TapReverse marks the reverse rule of a two-way policy in TapRule.ID.
const TapReverse = 1 << 31

// TapCapture marks a rule that copies to a running capture (onehop tap
// capture) in TapRule.ID: the policy's rules again, to the capture's
// collector.
const TapCapture = 1 << 30

// TapCaptureRecord is a running capture of a TAP policy: while it is
// stored, the policy's copies also go to Collector (the controller that
// serves the capture), as ERSPAN type II with the policy's id as session.
type TapCaptureRecord struct {
	Policy    string `json:"policy"`
	Collector string `json:"collector"`
}

// TapStats is one rule's copies on one node.
type TapStats struct {
	Policy  string `json:"policy"`
	ID      uint32 `json:"id"`
	Packets uint64 `json:"packets"` // copies made (sender edge) or delivered (monitor edge)
	Bytes   uint64 `json:"bytes"`
	Dropped uint64 `json:"dropped"` // copies lost: the monitor's share exceeded, a clone failed
}

// Digest identifies a Desired by content, so an agent can report which
// version it has applied.
func (d Desired) Digest() string {
	b, _ := json.Marshal(d) // plain structs of strings: cannot fail
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// AgentStatus is what an agent reports after each reconcile.
type AgentStatus struct {
	Node          string `json:"node"`
	AppliedDigest string `json:"appliedDigest"`
	// AppliedRevision is the store revision of the latest change to the
	// host's desired keys (or the farm states it follows) that the agent
	// has applied: an intent change at revision R has reached the host
	// once this is at least the revision of the desired key R made.
	AppliedRevision int64    `json:"appliedRevision,omitempty"`
	Endpoints       int      `json:"endpoints"`
	AttachedVifs    []string `json:"attachedVifs"`
	MissingVifs     []string `json:"missingVifs,omitempty"`
	// VifKinds is each attached vif's kind (veth, tap): how the datapath
	// delivers to its guest.
	VifKinds map[string]string `json:"vifKinds,omitempty"`
	// RefusedVifs are guests' interfaces that exist but that no guest can
	// be on (a bridge, a tun without tap mode, ...), by name, with why:
	// left unattached, their VMs unreachable.
	RefusedVifs map[string]string `json:"refusedVifs,omitempty"`
	// Drops and Forwards are the datapath counters, refreshed every few
	// seconds (Prometheus on the agent has them live).
	Drops    map[string]uint64 `json:"drops,omitempty"`
	Forwards map[string]uint64 `json:"forwards,omitempty"`
	// ARP is the ARP engine's view: mapping-table use and what it did.
	ARP *ARPStats `json:"arp,omitempty"`
	// Refused counts, per VM, the shared work each was refused for going
	// over its share (one VM must not starve the others).
	Refused []VMRefusal `json:"refused,omitempty"`
	// Slivers are the per-sliver counters of the port-space datapath.
	Slivers []SliverStats `json:"slivers,omitempty"`
	// Taps are the per-rule copy counters of the virtual TAP datapath.
	Taps []TapStats `json:"taps,omitempty"`
	// Egress is each egress VM's use of its slice (docs/north-south.md).
	Egress []EgressStats `json:"egress,omitempty"`
	// Overflows lists the maps that cannot hold what this node needs:
	// nothing was written to them, they keep what they held (and Error
	// says so too).
	Overflows []MapOverflow `json:"overflows,omitempty"`
	// Version is the agent's binary (onehop version): `onehop status`
	// flags an agent whose version is not the controller's.
	Version *version.Info `json:"version,omitempty"`
	Error   string        `json:"error,omitempty"`
	Time    time.Time     `json:"time"`
}

// MapOverflow is a datapath map too small for what a node needs.
type MapOverflow struct {
	Feature  string `json:"feature"`
	Map      string `json:"map"`
	Want     int    `json:"want"`
	Capacity int    `json:"capacity"`
}

// VMRefusal is one VM's count of refused work of one kind (dhcp, ...).
type VMRefusal struct {
	VM    string `json:"vm"`
	What  string `json:"what"`
	Count uint64 `json:"count"`
}

// ARPStats reports a host's mapping table and ARP engine (paper §2).
type ARPStats struct {
	// The mapping table: entries holding a host, entries still being
	// asked, and its fixed capacity.
	Mapped   int `json:"mapped"`
	Asking   int `json:"asking"`
	Capacity int `json:"capacity"`
	// What the engine did since the agent started.
	UnicastRequests   uint64 `json:"unicastRequests"`   // to the last known host, first
	MulticastRequests uint64 `json:"multicastRequests"` // to the farm/subnet's Ethernet multicast address
	Resolved          uint64 `json:"resolved"`          // addresses it found a host for
	Unresolved        uint64 `json:"unresolved"`        // addresses no host answered for
	Refreshed         uint64 `json:"refreshed"`         // entries in use, confirmed again
	Expired           uint64 `json:"expired"`           // entries unused for too long, forgotten
	Lost              uint64 `json:"lost"`              // entries whose host stopped answering, forgotten
	Purged            uint64 `json:"purged"`            // entries of VMs that left the intent (deleted), forgotten
	Held              uint64 `json:"held"`              // packets held while their destination was resolved
	Released          uint64 `json:"released"`          // held packets sent on once resolved
	Discarded         uint64 `json:"discarded"`         // held packets dropped: unresolved, queue full or too big
	Announced         uint64 `json:"announced"`         // announcements of VMs that arrived on this host
}

// FarmEgress is a farm's egress setting: the destinations its VMs may
// reach outside the tenant space (IPv4 CIDRs; empty: anywhere) and the
// size of the slice of its host's address each VM gets (ports, and ICMP
// echo ids).
type FarmEgress struct {
	To    []string `json:"to,omitempty"`
	Slice uint16   `json:"slice"`
}

// LeaseSpace is the record of the leases of a host's address that are not
// slivers (whose records are the host's own keys): the VMs' egress slices
// and published ports, by FARM/SUBNET/VM. A claim stands while its VM's
// record holds it on that host; a writer of the lease space drops the
// others.
type LeaseSpace struct {
	Slices    map[string]Lease         `json:"slices,omitempty"`
	Published map[string][]Publication `json:"published,omitempty"`
}

// SubnetEgress is a subnet's own egress setting: Off, whatever its farm's
// is, or on, with To and Slice as a farm's are.
type SubnetEgress struct {
	Off   bool     `json:"off,omitempty"`
	To    []string `json:"to,omitempty"`
	Slice uint16   `json:"slice,omitempty"`
}

// EffectiveEgress is the egress a subnet's VMs get: the subnet's own
// setting where it has one, else its farm's (nil: off).
func EffectiveEgress(farm *FarmEgress, subnet *SubnetEgress) *FarmEgress {
	switch {
	case subnet == nil:
		return farm
	case subnet.Off:
		return nil
	}
	return &FarmEgress{To: subnet.To, Slice: subnet.Slice}
}

// VMEgress is one VM's egress: its slice, a lease of its host's uplink
// address in the same lease space as slivers' (internal/lease), and the
// destinations its farm allows, copied so a host's desired state holds
// what its datapath needs.
type VMEgress struct {
	Slice Lease    `json:"slice"`
	To    []string `json:"to"`
}

// Publication is one published port of a VM: connections to its host's
// uplink-0 address on PublicPort (Proto, "tcp" or "udp") reach the VM's
// Port, with the client's own address.
type Publication struct {
	Proto      string `json:"proto"`
	Port       uint16 `json:"port"`
	PublicPort uint16 `json:"publicPort"`
}

// Lease is the port of the host's address p holds (uplink 0).
func (p Publication) Lease() Lease { return Lease{Lo: p.PublicPort, Hi: p.PublicPort} }

// String is "tcp 80 on 8080", as the CLI and errors name a publication.
func (p Publication) String() string {
	return p.Proto + " " + strconv.Itoa(int(p.Port)) + " on " + strconv.Itoa(int(p.PublicPort))
}

// EgressStats is one VM's egress on its host: its slice, the flows it
// opened and holds, and what it was refused.
type EgressStats struct {
	Name       string `json:"name"`
	Slice      string `json:"slice"` // LO-HI of the host's address
	Ports      int    `json:"ports"`
	Floating   string `json:"floating,omitempty"` // its floating address, if it has one
	Live       int    `json:"live"`               // translations holding a port now
	Flows      uint64 `json:"flows"`
	Refused    uint64 `json:"refused"`    // new flows refused: the slice was full
	NotAllowed uint64 `json:"notAllowed"` // to destinations its farm does not list
	PacketsOut uint64 `json:"packetsOut"`
	PacketsIn  uint64 `json:"packetsIn"`
	BytesOut   uint64 `json:"bytesOut"`
	BytesIn    uint64 `json:"bytesIn"`
}
