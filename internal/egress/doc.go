// Package egress is north-south egress (docs/north-south.md): a VM of a
// farm with egress on reaches addresses outside the tenant space through
// its own host's uplink address, with source ports from its own slice of
// that address. compile.go turns a node's VMs into map entries; the rest
// is the agent's feature (Sync, Stats, metrics). The setting's rules are
// internal/egressspec.
package egress
