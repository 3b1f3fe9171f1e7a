package lab

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/onehop/onehop/internal/topology"
)

// xtrKind is a data center's LISP tunnel router: a namespace on the fabric
// (mgmt0, to register with the map-server) with a link named after each of
// its WANs (an RLOC each, the upper half's +2) and, made by its servers, an
// s-SERVER link to each server. It runs `onehop xtr run`.
type xtrKind struct{}

func (xtrKind) kind() string { return "xtr" }

func (xtrKind) nodes(t *topology.File) []string {
	var out []string
	for _, x := range t.XTRs() {
		out = append(out, x.Name)
	}
	return out
}

func (xtrKind) plumb(_ context.Context, b *builder, node string) error {
	x, _ := b.t.XTRByName(node)
	b.step("xtr %s (%s): %s %s on the fabric, EID prefix %s, RLOCs on %s", node, NamespaceOf(b.st.Name, node), cloudMgmt, x.Address, x.EIDPrefix, strings.Join(x.WANs, ", "))
	ns, err := b.newNamespace(node, "xtr")
	if err != nil {
		return err
	}
	if err := b.plugIntoFabric(ns, fabricPort(node, 0), cloudMgmt, x.Address, b.t.FabricPrefix().Bits()); err != nil {
		return err
	}
	c := &CloudNode{EIDPrefix: x.EIDPrefix, MapServer: mapServer(b.t)}
	for _, wn := range x.WANs {
		w, _ := b.t.WANByName(wn)
		side := w.XTRSide()
		if err := vethBetween(ns, wn, netip.PrefixFrom(topology.SideNode(side), side.Bits()),
			NamespaceOf(b.st.Name, wn), wanXTRSide, netip.PrefixFrom(topology.SideRouter(side), side.Bits())); err != nil {
			return err
		}
		if err := routeVia(ns, w.GatewaySide(), topology.SideRouter(side), wn); err != nil {
			return err
		}
		c.Paths = append(c.Paths, CloudPath{WAN: wn, RLOC: topology.SideNode(side).String()})
	}
	return b.setCloud(node, c)
}

// xtrArgs are the arguments of xTR x's daemon.
func xtrArgs(st *State, t *topology.File, x topology.XTR) []string {
	args := []string{"xtr", "run", "--eid-prefix", x.EIDPrefix, "--map-server", mapServer(t),
		"--key-file", lispKeyFile(st, x.Name), "--key-id", fmt.Sprint(keyIDOf(t, x.Name)),
		// Through the WAN routers, the xTR's links lead only to the access
		// gateway, whose decapsulated packets are all for its own sockets;
		// its site links are veths into the servers' namespaces, whose
		// sockets take the gateway's superpackets whole (uploads).
		"--whole-superpackets", "--site-whole-superpackets"}
	for _, wn := range x.WANs {
		args = append(args, "--rloc", wn)
	}
	for _, s := range x.Servers {
		args = append(args, "--eid-dev", "s-"+s.Name)
	}
	return append(args, "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", MetricsPort))
}

// activate runs the xTR once every node is plumbed (its servers' links are
// made after it: see kinds) and the controller, its map-server, answers,
// and waits for its EID prefix to be registered.
func (xtrKind) activate(ctx context.Context, b *builder, node string) error {
	x, _ := b.t.XTRByName(node)
	if len(x.Servers) == 0 {
		b.step("xtr %s has no servers: not started (nothing to attach the site side to)", node)
		return nil
	}
	if err := b.waitStore(ctx); err != nil {
		return err
	}
	b.step("xtr %s: onehop xtr run (map-server %s)", node, mapServer(b.t))
	if err := b.spawn("xtr-"+node, node, NamespaceOf(b.st.Name, node), xtrArgs(b.st, b.t, x)...); err != nil {
		return err
	}
	p := netip.MustParsePrefix(x.EIDPrefix)
	return b.poll(ctx, "xtr "+node+"'s registration", func() (bool, string, error) {
		ok, err := b.lispRegistered(ctx, p)
		return ok, p.String() + " not registered", err
	})
}
