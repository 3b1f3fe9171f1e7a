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
	for k, addr := range h.UplinkAddrs {
		b.step("host %s (%s): uplink %s %s/%d", node, NamespaceOf(b.st.Name, node), topology.UplinkName(k), addr, bits)
	}
	ns, err := b.newNamespace(node, "host")
	if err != nil {
		return err
	}
	devs := make([]string, len(h.UplinkAddrs))
	for k, addr := range h.UplinkAddrs {
		devs[k] = topology.UplinkName(k)
		if k == 0 && b.t.Datapath == topology.DatapathBridge {
			// The address goes on the host's bridge instead.
			if err := b.plugIntoFabric(ns, fabricPort(node, 0), HostUplink, "", bits); err != nil {
				return err
			}
			if err := hostBridge(ns, addr, bits); err != nil {
				return err
			}
			devs[k] = "br0"
			continue
		}
		if err := b.plugIntoFabric(ns, fabricPort(node, k), topology.UplinkName(k), addr, bits); err != nil {
			return err
		}
	}
	if len(h.UplinkAddrs) > 1 {
		return multiHome(ns, devs, h.UplinkAddrs, b.t.FabricPrefix())
	}
	return nil
}

// fabricPort is the fabric's end of a host's uplink k: p-HOST for uplink 0
// (as it always was), p<k>-HOST for the others; 15 bytes at most for a
// 12-byte host name.
func fabricPort(host string, k int) string {
	if k == 0 {
		return "p-" + host
	}
	return fmt.Sprintf("p%d-%s", k, host)
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
	// The agent attaches its slivers' socket programs to this directory.
	if err := ensureCgroup(b.st, HostCgroupDir(b.st, node)); err != nil {
		return err
	}
	b.step("agent on %s (metrics on http://127.0.0.1:%d/metrics in its namespace)", node, MetricsPort)
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
			v, err := b.allocation(ctx, b.t.VMNode(vm))
			if err != nil {
				return "", err
			}
			vifs = append(vifs, v.Interface)
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
