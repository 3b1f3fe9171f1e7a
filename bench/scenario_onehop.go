package main

import "context"

// onehopScenario: vm1 on h1 -> vm2 on h2, one subnet, across the fabric
// through onehop's eBPF datapath.
var onehopScenario = &Scenario{
	Name:        "onehop",
	Description: "lab " + onehopLab.Name + ": vm1 on h1 -> vm2 on h2, one subnet, through onehop's eBPF datapath",
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := e.Lab(ctx, onehopLab)
		if err != nil {
			return nil, err
		}
		p, err := l.Pair("vm1", "vm2")
		return []*Pair{p}, err
	},
	Baselines: []Baseline{
		// Issue 2: onehop is no slower than the physical reference.
		{Scenario: "bridge", Targets: map[string]Target{"tcp": {Ratio: 1.0}, "rtt": {Ratio: 1.05}, "udp64": {Ratio: 1.0}}},
		{Scenario: "veth"},
	},
}
