package main

import "context"

// routedScenario: vm1 (net) on h1 -> vm3 (net2) on h2, one-hop routing
// between subnets in onehop's datapath.
var routedScenario = &Scenario{
	Name:        "routed",
	Description: "lab " + onehopLab.Name + ": vm1 (net) on h1 -> vm3 (net2) on h2: one-hop routing between subnets",
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := e.Lab(ctx, onehopLab)
		if err != nil {
			return nil, err
		}
		p, err := l.Pair("vm1", "vm3")
		return []*Pair{p}, err
	},
	Baselines: []Baseline{
		// Issue 3: crossing subnets costs (almost) nothing: >= 0.97x on
		// every figure, which for RTT is <= 1/0.97.
		{Scenario: "onehop", Targets: map[string]Target{"tcp": {Ratio: 0.97}, "rtt": {Ratio: 1 / 0.97}, "udp64": {Ratio: 0.97}}},
		// Issue 3: against a routing namespace, lower RTT.
		{Scenario: "router", Targets: map[string]Target{"rtt": {Ratio: 1.0, Strict: true}}},
	},
}
