package lab

import (
	"context"

	"github.com/onehop/onehop/internal/topology"
)

// externalKind is a plain machine on the fabric, the Internet as far as the
// lab is concerned: a namespace whose eth0 is plugged into the fabric bridge
// with its own address. It runs no onehop (but the VNAT daemon, an
// endpoint's own, with vnat: true); it is what slivers and VMs are reached
// from and reach out to.
type externalKind struct{}

// ExternalInterface is an external machine's NIC on the fabric.
const ExternalInterface = "eth0"

func (externalKind) kind() string { return "external" }

func (externalKind) nodes(t *topology.File) []string {
	es := t.Externals()
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.Name)
	}
	return out
}

func (externalKind) plumb(_ context.Context, b *builder, node string) error {
	e, _ := b.t.ExternalByName(node)
	bits := b.t.FabricPrefix().Bits()
	b.step("external %s (%s): %s %s/%d on the fabric", node, NamespaceOf(b.st.Name, node), ExternalInterface, e.Address, bits)
	ns, err := b.newNamespace(node, "external")
	if err != nil {
		return err
	}
	return b.plugIntoFabric(ns, fabricPort(node, 0), ExternalInterface, e.Address, bits)
}

// start starts the external's own daemons: the VNAT daemon, with vnat: true.
func (externalKind) start(ctx context.Context, b *builder, node string) error {
	if !vnatOf(b.t, node) {
		return nil
	}
	return startVNAT(ctx, b, node, ExternalInterface)
}
