package lab

import (
	"context"
	"path/filepath"

	"github.com/onehop/onehop/internal/topology"
)

// controllerKind is the management server on the fabric: the controller
// with its embedded etcd. Only an onehop lab has one.
type controllerKind struct{}

func (controllerKind) kind() string { return "controller" }

func (controllerKind) nodes(t *topology.File) []string {
	if t.Datapath != topology.DatapathOnehop {
		return nil
	}
	return []string{"controller"}
}

func (controllerKind) plumb(_ context.Context, b *builder, node string) error {
	b.step("controller %s at %s (embedded etcd, data in %s)", NamespaceOf(b.st.Name, node), b.t.Fabric.Controller, filepath.Join(b.st.Dir, "etcd"))
	ns, err := b.newNamespace(node, "controller")
	if err != nil {
		return err
	}
	return b.plugIntoFabric(ns, "p-controller", ctlInterface, b.t.Fabric.Controller, b.t.FabricPrefix().Bits())
}

func (controllerKind) start(_ context.Context, b *builder, node string) error {
	if err := b.makePKI(); err != nil {
		return err
	}
	lisp, err := cloudControllerArgs(b)
	if err != nil {
		return err
	}
	return b.spawn("controller", node, NamespaceOf(b.st.Name, node), append(append(controllerArgs(b.st), b.controllerTLSArgs()...), lisp...)...)
}
