// Package limits holds the datapath's fixed capacities as plain numbers, so
// the controller can refuse what a host cannot hold when it is asked (a VM
// create, a rule, a sliver) rather than an agent finding out later, without
// importing a package that loads BPF. It imports nothing: the numbers are
// the C's (bpf/lib/*_maps.h), each written here once, and a test of the
// package that loads the maps (internal/datapath, internal/portspace,
// internal/tap) compares them with the compiled programs' maps.
package limits

const (
	// MaxVMsPerHost is the per-host endpoint capacity (MAX_ENDPOINTS): the
	// only limit on VMs per host, whatever farm or subnet they are in.
	MaxVMsPerHost = 4096

	// MaxFirewallRules is how many rules a VM's firewall holds per
	// direction (FW_MAX_RULES: the datapath walks them in a bounded loop).
	MaxFirewallRules = 16

	// MaxVisibilityRules is how many visibility rules one host holds
	// (MAX_VIS_RULES): only the rules of farms with VMs on the host reach
	// it. The map holds twice as many, so a changed rule set can be
	// written beside the one in force.
	MaxVisibilityRules = 16384

	// MaxFlows is the conntrack table's size (MAX_FLOWS): beyond it the
	// least recently used flows are forgotten.
	MaxFlows = 65536

	// DefaultMappingTableSize is the mapping table's default size
	// (MAX_MAPPINGS; the agent's --mapping-table-size changes it).
	DefaultMappingTableSize = 16384

	// MaxScopes and MaxScopeMembers bound the broadcast scopes of a host:
	// every VM is in two, its subnet's and its farm's (MAX_SCOPES,
	// MAX_SCOPE_MEMBERS), so neither is a limit of its own.
	MaxScopes       = 2 * MaxVMsPerHost
	MaxScopeMembers = 2 * MaxVMsPerHost

	// MaxSlivers is how many slivers one host holds (PORTSPACE_MAX_SLIVERS):
	// their slots run 1..MaxSlivers.
	MaxSlivers = 16384
	// MaxUplinks is how many uplinks one host may lease ports on
	// (PORTSPACE_MAX_UPLINKS).
	MaxUplinks = 4

	// MaxTapRules is how many TAP rules (policy directions) one host holds
	// (TAP_MAX_RULES).
	MaxTapRules = 256
	// MaxTapTargets is how many distinct monitors (local VMs and remote
	// hosts) one host's TAP rules copy to (TAP_MAX_TARGETS: one 64-bit set
	// per packet keeps the datapath's walk within the BPF stack).
	MaxTapTargets = 64
)
