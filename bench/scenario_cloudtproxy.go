package main

import "context"

// cloudTProxyScenario: interception only: gfast intercepts the user's TCP
// to sfast's native address, which has no mapping (a negative Map-Reply),
// and proxies it as plain TCP over wfast, routed natively.
var cloudTProxyScenario = &Scenario{
	Name:        "cloudtproxy",
	Description: "lab " + cloudLab.Name + ": ufull -> sfast's non-EID address through gateway gfast (TPROXY, plain TCP, no LISP), one unshaped WAN",
	// The gateway carries TCP; ping and UDP would measure native routing.
	Tests: []string{"tcp"},
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := cloudLabUp(ctx, e, siteFast)
		if err != nil {
			return nil, err
		}
		return []*Pair{cloudPair(e, l, siteFast, siteFast.nativeAddr())}, nil
	},
}
