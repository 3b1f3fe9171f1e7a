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
// streams (where to publish its events). It also reads the trace requests
// for its host (TraceRequestsPrefix).
func AgentReads(host string) []string {
	return []string{DesiredHostPrefix(host), FarmStatePrefix, NodesPrefix, VMsPrefix, PlanKey, ObservePrefix, TraceRequestsPrefix + host + "/"}
}

// AgentWrites are the only keys host's agent writes: its node record
// (at start) and its status. Each is one key, not a prefix, so h1's
// grant says nothing of h10's.
// Its answers to traces (TraceReplyKey) are its own too.
func AgentWrites(host string) []string {
	return []string{NodesPrefix + host, StatusPrefix + host, TraceReplyKey(host)}
}

// `onehop trace` asks the agents of the hosts on a packet's path to run
// their programs on it (internal/trace): the controller writes a request
// to TraceRequestKey(HOST) and watches TraceReplyKey(HOST), which that
// host's agent overwrites with each answer (the answer carries the
// request's ID). One key each way, overwritten: a trace costs two writes
// per host and leaves nothing to delete, and a watch sees every revision,
// so traces at once are all answered. Through the store, a trace is
// authorized as all else is: only the controller writes requests, only the
// host answers for itself.
const TraceRequestsPrefix = Root + "trace/requests/"

// TraceRequestKey is where the controller asks host's agent to trace (under
// TraceRequestsPrefix + HOST + "/", the prefix the agent reads).
func TraceRequestKey(host string) string { return TraceRequestsPrefix + host + "/next" }

// TraceReplyKey is where host's agent answers trace requests.
func TraceReplyKey(host string) string { return Root + "trace/replies/" + host }
