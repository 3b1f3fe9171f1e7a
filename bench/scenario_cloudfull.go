package main

import "context"

// cloudFullScenario: the paper's full gateway on one unshaped path: the
// user's plain TCP intercepted by gfast, re-opened as MPTCP from its EID,
// LISP-encapsulated in the kernel over wfast, decapsulated by xfast for
// sfast (an MPTCP server).
var cloudFullScenario = &Scenario{
	Name:        "cloudfull",
	Description: "lab " + cloudLab.Name + ": ufull -> sfast's EID through gateway gfast (TPROXY + MPTCP + LISP in eBPF) and xtr xfast, one unshaped WAN",
	// The gateway carries TCP; ping and UDP would measure native routing.
	Tests: []string{"tcp"},
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := cloudLabUp(ctx, e, siteFast)
		if err != nil {
			return nil, err
		}
		return []*Pair{cloudPair(e, l, siteFast, siteFast.srvEID())}, nil
	},
	Baselines: []Baseline{
		// Issue 11: the full gateway keeps 95% of plain NAT's throughput
		// on one path (the paper's user-space LISP router kept 82%).
		// Issue 20: at most 3x NAT's CPU per GB (uploads crossing the
		// tunnel whole; 8-11x while the gateway segmented them).
		{Scenario: "cloudnat", Targets: map[string]Target{"tcp": {Ratio: 0.95}, "cpu": {Ratio: 3}}},
		{Scenario: "cloudtproxy"},
	},
}
