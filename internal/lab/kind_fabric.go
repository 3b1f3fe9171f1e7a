package lab

import (
	"context"
	"fmt"

	"github.com/vishvananda/netlink"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/topology"
)

// fabricKind is the flat L2 underlay: a namespace holding one Linux bridge
// that every host's uplink and the controller plug into.
type fabricKind struct{}

func (fabricKind) kind() string { return "fabric" }

func (fabricKind) nodes(*topology.File) []string { return []string{"fabric"} }

func (fabricKind) plumb(_ context.Context, b *builder, node string) error {
	b.step("fabric %s: bridge %s for %s", NamespaceOf(b.st.Name, node), FabricBridge, b.t.FabricPrefix())
	ns, err := b.newNamespace(node, "fabric")
	if err != nil {
		return err
	}
	// A switch reports no multicast memberships of its own.
	if err := netns.WriteSysctl(ns, "net/ipv4/igmp_link_local_mcast_reports", "0"); err != nil {
		return err
	}
	fh, err := netns.Handle(ns)
	if err != nil {
		return err
	}
	b.fabric = fh // closed when Up ends
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: FabricBridge}}
	if err := fh.LinkAdd(br); err != nil {
		return fmt.Errorf("create fabric bridge: %w", err)
	}
	// The fabric is a switch, not a host: without this its ports and the
	// bridge itself (address-less IPv4 devices) send IGMP reports from
	// 0.0.0.0 onto the wire.
	if err := fh.LinkSetMulticastOff(br); err != nil {
		return fmt.Errorf("fabric bridge: %w", err)
	}
	if err := fh.LinkSetUp(br); err != nil {
		return fmt.Errorf("bring up fabric bridge: %w", err)
	}
	return nil
}
