package main

import "context"

// The veth pair's names and addresses (10.255.0.0/24: no lab allocates it).
const (
	vethIfA   = "ohb-a"
	vethIfB   = "ohb-b"
	vethSrcIP = "10.255.0.1"
	vethDstIP = "10.255.0.2"
)

// vethScenario: one raw veth pair between two namespaces, the floor every
// other path is built on.
var vethScenario = &Scenario{
	Name:        "veth",
	Description: "namespaces " + netnsPrefix + "a -> " + netnsPrefix + "b joined by one veth pair",
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		progress("setup: veth pair %sa (%s) <-> %sb (%s)", netnsPrefix, vethSrcIP, netnsPrefix, vethDstIP)
		a, err := e.Netns(ctx, "a")
		if err != nil {
			return nil, err
		}
		b, err := e.Netns(ctx, "b")
		if err != nil {
			return nil, err
		}
		err = IP(ctx,
			[]string{"link", "add", vethIfA, "netns", a, "type", "veth", "peer", "name", vethIfB, "netns", b},
			[]string{"-n", a, "addr", "add", vethSrcIP + "/24", "dev", vethIfA},
			[]string{"-n", b, "addr", "add", vethDstIP + "/24", "dev", vethIfB},
			[]string{"-n", a, "link", "set", vethIfA, "up"},
			[]string{"-n", b, "link", "set", vethIfB, "up"})
		if err != nil {
			return nil, err
		}
		return []*Pair{{DstIP: vethDstIP, Src: InNetns(a), Dst: InNetns(b), Server: b}}, nil
	},
}
