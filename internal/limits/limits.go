// Package limits holds the datapath's fixed capacities as plain numbers, so
// the controller can refuse what a host cannot hold when it is asked (a VM
// create, a rule) rather than an agent finding out later. It imports
// nothing: the numbers are the C's (bpf/lib/*_maps.h), and a test in
// internal/datapath compares them with the compiled programs' maps.
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
)
