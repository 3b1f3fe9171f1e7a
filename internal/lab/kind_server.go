package lab

import (
	"context"
	"net/netip"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/topology"
)

// serverKind is a machine in a data center's EID prefix: eth0 with its EID
// (in the prefix's length) and a default route through the xTR, whose end
// s-SERVER holds the xTR's own EID (/32) and a route to the server's. With
// mptcp (the default) its MPTCP limits take a gateway's subflows; with
// mptcp: false MPTCP is off, so a gateway falls back to TCP.
type serverKind struct{}

func (serverKind) kind() string { return "server" }

func (serverKind) nodes(t *topology.File) []string {
	var out []string
	for _, x := range t.XTRs() {
		for _, s := range x.Servers {
			out = append(out, s.Name)
		}
	}
	return out
}

func (serverKind) plumb(_ context.Context, b *builder, node string) error {
	s, x, _ := b.t.ServerByName(node)
	p := netip.MustParsePrefix(x.EIDPrefix)
	addr := netip.MustParseAddr(s.Address)
	mptcp := "takes MPTCP"
	if !s.TakesMPTCP() {
		mptcp = "MPTCP off"
	}
	b.step("server %s (%s): %s %s/%d behind xtr %s, %s", node, NamespaceOf(b.st.Name, node), cloudNIC, addr, p.Bits(), x.Name, mptcp)
	ns, err := b.newNamespace(node, "server")
	if err != nil {
		return err
	}
	xns := NamespaceOf(b.st.Name, x.Name)
	if err := vethBetween(xns, "s-"+node, netip.PrefixFrom(x.XTRAddr(), 32), ns, cloudNIC, netip.PrefixFrom(addr, p.Bits())); err != nil {
		return err
	}
	if err := routeVia(xns, netip.PrefixFrom(addr, 32), netip.Addr{}, "s-"+node); err != nil {
		return err
	}
	if err := routeVia(ns, netip.MustParsePrefix("0.0.0.0/0"), x.XTRAddr(), cloudNIC); err != nil {
		return err
	}
	if s.TakesMPTCP() {
		/* one subflow per path of the gateway (the kernel's limit is 8);
		   the gateway opens them all, so none is accepted from ADD_ADDR */
		if err := runCmd("ip", "-n", ns, "mptcp", "limits", "set", "subflows", "8", "add_addr_accepted", "0"); err != nil {
			return err
		}
	} else if err := netns.WriteSysctl(ns, "net/mptcp/enabled", "0"); err != nil {
		return err
	}
	return b.setCloud(node, &CloudNode{Via: x.Name})
}
