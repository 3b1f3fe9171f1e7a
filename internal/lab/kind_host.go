package lab

import (
	"context"
	"fmt"

	"github.com/onehop/onehop/internal/topology"
)

// hostKind is a physical server: a namespace with an uplink on the fabric
// and, in an onehop lab, an agent whose datapath sits on the uplink and on
// every vif. In a bridge lab its uplink and vifs share a Linux bridge.
type hostKind struct{}

func (hostKind) kind() string { return "host" }

func (hostKind) nodes(t *topology.File) []string {
	out := make([]string, 0, len(t.Hosts))
	for _, h := range t.Hosts {
		out = append(out, h.Name)
	}
	return out
}

func (hostKind) plumb(_ context.Context, b *builder, node string) error {
	h, _ := b.t.HostByName(node)
	bits := b.t.FabricPrefix().Bits()
	b.step("host %s (%s): uplink %s %s/%d", node, NamespaceOf(b.st.Name, node), HostUplink, h.Address, bits)
	ns, err := b.newNamespace(node, "host")
	if err != nil {
		return err
	}
	if b.t.Datapath == topology.DatapathBridge {
		// The address goes on the host's bridge instead.
		if err := b.plugIntoFabric(ns, "p-"+node, HostUplink, "", bits); err != nil {
			return err
		}
		return hostBridge(ns, h.Address, bits)
	}
	return b.plugIntoFabric(ns, "p-"+node, HostUplink, h.Address, bits)
}

func (hostKind) start(ctx context.Context, b *builder, node string) error {
	if b.t.Datapath != topology.DatapathOnehop {
		return nil
	}
	// The agents pin their maps and links here, outside /sys (which every
	// namespaced process sees remounted).
	if err := MountBPFFS(b.st.BPFFS); err != nil {
		return err
	}
	// An agent that cannot reach etcd at start gives up.
	if err := b.waitStore(ctx); err != nil {
		return err
	}
	h, _ := b.t.HostByName(node)
	b.step("agent on %s (metrics on http://%s:%d/metrics)", node, h.Address, MetricsPort)
	return b.spawn("agent-"+node, node, NamespaceOf(b.st.Name, node), append(agentArgs(b.st, b.t, node), b.agentTLSArgs(node)...)...)
}

// notReady waits for the agent to have its datapath on every vif of the
// host (each still down: see vmKind.activate).
func (hostKind) notReady(ctx context.Context, b *builder, node string) (string, error) {
	if b.t.Datapath != topology.DatapathOnehop {
		return "", nil
	}
	s, err := b.store()
	if err != nil {
		return "", err
	}
	var vifs []string
	for _, vm := range b.t.VMs {
		if vm.Host == node {
			vifs = append(vifs, topology.VifName(vm.Name))
		}
	}
	d, st, err := agentReport(ctx, s, node)
	if err != nil {
		return err.Error(), nil // the store may be busy: ask again
	}
	return agentWaitsFor(d, st, vifs, true), nil
}

func (hostKind) report(n *NodeReport, f *statusFacts) { n.Agent = f.agents[n.Name] }

// remove unmounts the agents' bpffs, and with it their pins.
func (hostKind) remove(st *State, say func(string, ...any)) error {
	if st.BPFFS == "" {
		return nil
	}
	unmounted, err := unmountBPFFS(st.BPFFS)
	if unmounted {
		say("unmounted bpffs %s (pinned maps and links)", st.BPFFS)
	}
	if err != nil {
		return fmt.Errorf("bpffs of lab %s: %w", st.Name, err)
	}
	return nil
}
