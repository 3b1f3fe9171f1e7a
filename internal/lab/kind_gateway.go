package lab

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/topology"
)

// gatewayKind is a multipath cloud-access gateway: a namespace on the
// fabric (mgmt0, to reach the map-server) with a link named after each of
// its WANs (its RLOC there, the lower half's .2) and, made by its users, a
// u-USER link to each user. It runs `onehop gateway run --lisp`: the
// users' TCP is intercepted and carried as MPTCP, one subflow per WAN from
// that path's EID, encapsulated in LISP; it registers its path EIDs with
// the map-server and asks it where destinations live.
type gatewayKind struct{}

func (gatewayKind) kind() string { return "gateway" }

func (gatewayKind) nodes(t *topology.File) []string {
	var out []string
	for _, g := range t.Gateways() {
		out = append(out, g.Name)
	}
	return out
}

func (gatewayKind) plumb(_ context.Context, b *builder, node string) error {
	g, _ := b.t.GatewayByName(node)
	b.step("gateway %s (%s): %s %s on the fabric, EIDs %s, paths %s", node, NamespaceOf(b.st.Name, node), cloudMgmt, g.Address, g.EIDPrefix, strings.Join(g.WANs, ", "))
	ns, err := b.newNamespace(node, "gateway")
	if err != nil {
		return err
	}
	if err := b.plugIntoFabric(ns, fabricPort(node, 0), cloudMgmt, g.Address, b.t.FabricPrefix().Bits()); err != nil {
		return err
	}
	c := &CloudNode{EIDPrefix: g.EIDPrefix, MapServer: mapServer(b.t)}
	for i, wn := range g.WANs {
		w, _ := b.t.WANByName(wn)
		side := w.GatewaySide()
		if err := vethBetween(ns, wn, netip.PrefixFrom(topology.SideNode(side), side.Bits()),
			NamespaceOf(b.st.Name, wn), wanGatewaySide, netip.PrefixFrom(topology.SideRouter(side), side.Bits())); err != nil {
			return err
		}
		// The far side of the WAN (the xTR's RLOC) through its router.
		if err := routeVia(ns, w.XTRSide(), topology.SideRouter(side), wn); err != nil {
			return err
		}
		c.Paths = append(c.Paths, CloudPath{WAN: wn, RLOC: topology.SideNode(side).String(), EID: g.PathEID(i).String()})
	}
	for k, v := range map[string]string{"net/ipv4/ip_forward": "1", "net/ipv4/conf/all/rp_filter": "0", "net/ipv4/conf/default/rp_filter": "0"} {
		if err := netns.WriteSysctl(ns, k, v); err != nil {
			return err
		}
	}
	return b.setCloud(node, c)
}

// gatewayArgs are the arguments of gateway g's daemon.
func gatewayArgs(st *State, t *topology.File, g topology.Gateway) []string {
	args := []string{"gateway", "run", "--eid-prefix", g.EIDPrefix, "--lisp",
		"--map-resolver", mapServer(t), "--map-server", mapServer(t),
		"--map-server-key-file", lispKeyFile(st, g.Name), "--key-id", fmt.Sprint(keyIDOf(t, g.Name)),
		// The lab's xTRs answer probes: a WAN cut anywhere on a path
		// takes it down, not only the gateway's own link.
		"--rloc-probe-interval", "1s",
		// The lab's xTRs take superpackets whole (--site-whole-superpackets).
		"--whole-superpackets",
		// The users reach the data center's servers and the Internet,
		// never the fabric (controller, hosts) or the WAN links' ends.
		"--infrastructure", t.FabricPrefix().String()}
	for _, wn := range g.WANs {
		w, _ := t.WANByName(wn)
		args = append(args, "--infrastructure", w.Prefix().String())
	}
	for _, u := range g.Users {
		args = append(args, "--intercept", "u-"+u.Name)
	}
	for i, wn := range g.WANs {
		w, _ := t.WANByName(wn)
		args = append(args, "--path", fmt.Sprintf("dev=%s,eid=%s,rloc=%s,name=%s", wn, g.PathEID(i), topology.SideNode(w.GatewaySide()), wn))
	}
	// Its operations port, on its node's loopback as every lab daemon's.
	return append(args, "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", MetricsPort))
}

// activate runs the gateway once every node is plumbed (its users' links
// are made after it: see kinds) and the controller, its map-server,
// answers, and waits for its path EIDs to be registered.
func (gatewayKind) activate(ctx context.Context, b *builder, node string) error {
	if err := b.waitStore(ctx); err != nil {
		return err
	}
	g, _ := b.t.GatewayByName(node)
	args := gatewayArgs(b.st, b.t, g)
	b.step("gateway %s: onehop gateway run (map-server %s)", node, mapServer(b.t))
	if err := b.spawn("gateway-"+node, node, NamespaceOf(b.st.Name, node), args...); err != nil {
		return err
	}
	return b.poll(ctx, "gateway "+node+"'s registration", func() (bool, string, error) {
		for i := range g.WANs {
			p := netip.PrefixFrom(g.PathEID(i), 32)
			if ok, err := b.lispRegistered(ctx, p); err != nil || !ok {
				return false, p.String() + " not registered", err
			}
		}
		return true, "", nil
	})
}
