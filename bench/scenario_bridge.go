package main

import "context"

// bridgeScenario: vm1 on h1 -> vm2 on h2 through a Linux bridge per host,
// no virtualization: the physical reference onehop is held to.
var bridgeScenario = &Scenario{
	Name:        "bridge",
	Description: "lab " + bridgeLab.Name + ": vm1 on h1 -> vm2 on h2 through a Linux bridge per host (no virtualization)",
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := e.Lab(ctx, bridgeLab)
		if err != nil {
			return nil, err
		}
		p, err := l.Pair("vm1", "vm2")
		return []*Pair{p}, err
	},
}
