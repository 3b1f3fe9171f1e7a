package lab

import (
	"context"

	"github.com/onehop/onehop/internal/topology"
)

// A nodeKind is one kind of lab node (the fabric, the controller, a host, a
// VM; later a sliver, an external client, a WAN router, a gateway) with its
// own plumbing. Each kind is one file, kind_NAME.go, plus one line in kinds;
// its topology entries are one file in internal/topology, where they are
// validated before anything is built.
//
// Up drives every kind through the same steps. Kinds are taken in the order
// of kinds, and each kind plumbs and then starts all of its nodes before the
// next kind begins, so a kind may rely on every kind before it being in
// place (the VMs on their hosts' namespaces and on the controller's
// allocations). Then every kind that waits is waited for, and last every
// kind that activates is activated.
type nodeKind interface {
	// kind is the name lab status shows: "host", "vm", ...
	kind() string
	// nodes lists the kind's nodes in t, in the order they are built.
	nodes(t *topology.File) []string
	// plumb makes the node's namespace, links and addresses.
	plumb(ctx context.Context, b *builder, node string) error
}

// A starter runs a node's processes once it is plumbed (build the arguments
// with a function in process.go).
type starter interface {
	start(ctx context.Context, b *builder, node string) error
}

// A waiter says what a node still waits for, "" once it is ready. Up polls
// every waiter until all are ready, after every node is started.
type waiter interface {
	notReady(ctx context.Context, b *builder, node string) (string, error)
}

// An activator finishes a node once every node is ready: a VM's vif comes
// up only after its host's datapath is on it.
type activator interface {
	activate(ctx context.Context, b *builder, node string) error
}

// A reporter adds what it knows about a node to lab status.
type reporter interface {
	report(n *NodeReport, f *statusFacts)
}

// A remover undoes what a kind made outside its nodes' namespaces and
// processes (both of which Teardown removes for every kind) at lab down.
type remover interface {
	remove(st *State, say func(string, ...any)) error
}

// kinds are the node kinds, in build order. A new kind is its own file and
// one line here.
var kinds = []nodeKind{
	fabricKind{},
	controllerKind{},
	hostKind{},
	externalKind{},
	vmKind{},
	sliverKind{},
	wanKind{},
	gatewayKind{},
	userKind{},
	xtrKind{},
	serverKind{},
}

// kindNamed returns the kind called name, or nil.
func kindNamed(name string) nodeKind {
	for _, k := range kinds {
		if k.kind() == name {
			return k
		}
	}
	return nil
}
