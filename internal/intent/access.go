package intent

// What a host's agent may do in the store, which etcd itself enforces
// (controller/etcdauth.go gives each host's agent certificate a role of
// exactly these): it reads what it applies and checks, and writes only the
// two records that are its own. Everything else — intent, desired state,
// farm states, LISP mappings, VNAT location records — is the controller's
// alone to write.

// AgentReads are the prefixes host's agent reads: its own desired keys, the
// farm states (it watches those of the farms its VMs are in), every
// host's node record (whom the datapath hears from the fabric), and the VM
// records (a fabric claim that a VM moved is believed only where the store
// places it: agent/claims.go; a deleted VM's learned mapping is forgotten:
// agent/purge.go), the cloud's address plan, and the running onehop observe
// streams (where to publish its events).
func AgentReads(host string) []string {
	return []string{DesiredHostPrefix(host), FarmStatePrefix, NodesPrefix, VMsPrefix, PlanKey, ObservePrefix}
}

// AgentWrites are the only keys host's agent writes: its node record
// (at start) and its status. Each is one key, not a prefix, so h1's
// grant says nothing of h10's.
func AgentWrites(host string) []string {
	return []string{NodesPrefix + host, StatusPrefix + host}
}
