package lab

import (
	"context"
	"net/netip"

	"github.com/onehop/onehop/internal/topology"
)

// userKind is a plain TCP client behind a cloud-access gateway: eth0 on a
// /30 to the gateway (whose end is u-USER) and a default route through it.
// It runs nothing and is configured with nothing about the gateway.
type userKind struct{}

func (userKind) kind() string { return "user" }

func (userKind) nodes(t *topology.File) []string {
	var out []string
	for _, g := range t.Gateways() {
		for _, u := range g.Users {
			out = append(out, u.Name)
		}
	}
	return out
}

func (userKind) plumb(_ context.Context, b *builder, node string) error {
	_, g, k, _ := b.t.UserByName(node)
	gwEnd, userEnd := g.UserLink(k)
	b.step("user %s (%s): %s %s, default via %s", node, NamespaceOf(b.st.Name, node), cloudNIC, userEnd, gwEnd.Addr())
	ns, err := b.newNamespace(node, "user")
	if err != nil {
		return err
	}
	if err := vethBetween(NamespaceOf(b.st.Name, g.Name), "u-"+node, gwEnd, ns, cloudNIC, userEnd); err != nil {
		return err
	}
	if err := routeVia(ns, netip.MustParsePrefix("0.0.0.0/0"), gwEnd.Addr(), cloudNIC); err != nil {
		return err
	}
	return b.setCloud(node, &CloudNode{Via: g.Name})
}
