package main

import "context"

// cloudTwoScenario: aggregation: utwo's plain TCP through gateway gtwo as
// MPTCP over both of its 100 Mbit/s WANs (wa, wb), LISP in the kernel,
// xtr xtwo, server stwo.
var cloudTwoScenario = &Scenario{
	Name:        "cloudtwo",
	Description: "lab " + cloudLab.Name + ": utwo -> stwo through gateway gtwo, MPTCP + LISP over two 100 Mbit/s WANs",
	// The gateway carries TCP; ping and UDP would measure native routing.
	Tests: []string{"tcp"},
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := cloudLabUp(ctx, e, siteTwo)
		if err != nil {
			return nil, err
		}
		return []*Pair{cloudPair(e, l, siteTwo, siteTwo.srvEID())}, nil
	},
	Baselines: []Baseline{
		// Issue 11: two paths give 1.9x one (kernel MPTCP alone: 1.93x).
		{Scenario: "cloudone", Targets: map[string]Target{"tcp": {Ratio: 1.9}}},
	},
}
