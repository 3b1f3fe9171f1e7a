package main

import "context"

// cloudOneScenario: the aggregation's baseline: the same gateway setup
// over one 100 Mbit/s WAN (gone, wc, xone, sone).
var cloudOneScenario = &Scenario{
	Name:        "cloudone",
	Description: "lab " + cloudLab.Name + ": uone -> sone through gateway gone, MPTCP + LISP over one 100 Mbit/s WAN",
	// The gateway carries TCP; ping and UDP would measure native routing.
	Tests: []string{"tcp"},
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := cloudLabUp(ctx, e, siteOne)
		if err != nil {
			return nil, err
		}
		return []*Pair{cloudPair(e, l, siteOne, siteOne.srvEID())}, nil
	},
}
