package main

import "context"

// routed2Scenario: two routed pairs at once, vm1 -> vm3 and vm4 -> vm5, h1
// (net) to h2 (net2), where a routing namespace would be the bottleneck.
var routed2Scenario = &Scenario{
	Name:        "routed-2",
	Description: "lab " + onehopLab.Name + ": vm1 -> vm3 and vm4 -> vm5 at once, h1 (net) to h2 (net2)",
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := e.Lab(ctx, onehopLab)
		if err != nil {
			return nil, err
		}
		return pairs(l, [2]string{"vm1", "vm3"}, [2]string{"vm4", "vm5"})
	},
	Baselines: []Baseline{
		// Issue 3: lower RTT, and >= 1.2x the small-packet rate with two
		// pairs, against the routing namespace.
		{Scenario: "router-2", Targets: map[string]Target{"rtt": {Ratio: 1.0, Strict: true}, "udp64": {Ratio: 1.2}}},
	},
}

// pairs makes a pair of l for each {from, to}.
func pairs(l *Lab, fromTo ...[2]string) ([]*Pair, error) {
	var out []*Pair
	for _, ft := range fromTo {
		p, err := l.Pair(ft[0], ft[1])
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}
