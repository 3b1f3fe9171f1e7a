package main

import (
	"context"
	"fmt"
	"strings"
)

// routerNetns is the routing namespace, Env.Netns's name for it.
const routerNetns = "rt"

// routerScenario: vm1 (net) on h1 -> vm3 (net2) on h2 in the bridge lab,
// through a routing namespace on the fabric (the paper's "routing VM").
var routerScenario = &Scenario{
	Name:        "router",
	Description: "lab " + bridgeLab.Name + ": vm1 (net) on h1 -> vm3 (net2) on h2 through routing namespace " + netnsPrefix + routerNetns + " on the fabric",
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := withRouter(ctx, e)
		if err != nil {
			return nil, err
		}
		p, err := l.Pair("vm1", "vm3")
		return []*Pair{p}, err
	},
}

// withRouter brings up the bridge lab with the routing baseline, the
// paper's "routing VM" as a namespace: the two subnets share the fabric's
// L2, and the routing namespace sits on the fabric with one leg in each
// subnet as its gateway (10.f.s.1, the address every VM already routes
// through). Traffic between subnets goes VM -> its host's bridge -> fabric
// -> router -> fabric -> the other host's bridge -> VM, as through a
// routing VM. The router and router-2 scenarios share it.
func withRouter(ctx context.Context, e *Env) (*Lab, error) {
	l, err := e.Lab(ctx, bridgeLab)
	if err != nil {
		return nil, err
	}
	return l, e.Once("router", func() error {
		progress("setup: routing namespace %s on lab %s's fabric, the gateway of both subnets", netnsPrefix+routerNetns, l.Name)
		ns, err := e.Netns(ctx, routerNetns)
		if err != nil {
			return err
		}
		steps := [][]string{
			{"netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1",
				// Both legs share one L2: each answers ARP for its own address only.
				"net.ipv4.conf.all.arp_ignore=1", "net.ipv4.conf.all.send_redirects=0"},
		}
		for i, vm := range []string{"vm1", "vm3"} { // one VM of each subnet
			ip, err := l.Addr(vm)
			if err != nil {
				return err
			}
			gw := ip[:strings.LastIndexByte(ip, '.')] + ".1/24"
			leg, port := fmt.Sprintf("leg%d", i+1), fmt.Sprintf("rt-leg%d", i+1)
			steps = append(steps,
				[]string{"link", "add", leg, "netns", ns, "type", "veth", "peer", "name", port, "netns", l.FabricNetns()},
				[]string{"-n", l.FabricNetns(), "link", "set", port, "master", "br0", "up"},
				[]string{"-n", ns, "addr", "add", gw, "dev", leg},
				[]string{"-n", ns, "link", "set", leg, "up"})
		}
		return IP(ctx, steps...)
	})
}
