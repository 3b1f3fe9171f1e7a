package main

import (
	"context"
)

// egressLabSpec: farm blue has egress (issue 22, docs/north-south.md);
// web1 on h1 reaches inet, a plain machine on the fabric, through a slice
// of h1's address. The NAT'd guest and h1's own stack reach the same inet
// over the same uplink.
var egressLabSpec = LabSpec{Name: "benchegress", Datapath: "onehop", Body: `farms:
  - name: blue
    subnets:
      - name: web
    egress: {slice: "4096"}
vms:
  - {name: web1, host: h1, subnet: blue/web}
externals:
  - {name: inet}
`}

// egressTests: what a VM reaching outside is judged by. Connections per
// second are cps (the server closes first, as a web server does, and a
// refused connection is counted, not the end of the test), not crr, whose
// client closes first: that keeps a slice's port 2 s past each close, and
// crr stops at its first refused dial (docs/north-south.md, sizing).
var egressTests = []string{"tcp", "rtt", "udp64", "cps"}

// egressScenario: VM web1 -> inet through onehop's egress: translated to
// a port of web1's slice in the VM program, out of the uplink; replies
// steered back by port in the uplink program.
var egressScenario = &Scenario{
	Name:        "egress",
	Description: "lab " + egressLabSpec.Name + ": VM web1 -> inet on the fabric through a slice of h1's address (onehop egress)",
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := e.Lab(ctx, egressLabSpec)
		if err != nil {
			return nil, err
		}
		p, err := l.Pair("web1", "inet")
		return []*Pair{p}, err
	},
	Tests: egressTests,
	Baselines: []Baseline{
		// Issue 22's targets against the usual setup, the host's nftables
		// masquerade.
		{Scenario: "egressnat", Targets: map[string]Target{"tcp": {Ratio: 1.0}, "udp64": {Ratio: 1.3}, "rtt": {Ratio: 0.9}, "cps": {Ratio: 1.0}}},
		// The floor: a sender with a routable address of its own, no
		// translation at all.
		{Scenario: "egressfloor"},
	},
}

// egressNATScenario: the usual setup: a guest with a private address
// behind nftables masquerade on h1 (routed by h1's stack) -> inet.
var egressNATScenario = &Scenario{
	Name:        "egressnat",
	Description: "lab " + egressLabSpec.Name + ": guest " + netnsPrefix + "egressnat (172.31.0.2, private) behind nftables masquerade on h1 -> inet",
	Build:       natToInet(egressLabSpec, "egressnat"),
	Tests:       egressTests,
}

// egressFloorScenario: h1's own stack -> inet: a routable address, nothing
// translated.
var egressFloorScenario = &Scenario{
	Name:        "egressfloor",
	Description: "lab " + egressLabSpec.Name + ": host h1's own stack (a routable address) -> inet",
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := e.Lab(ctx, egressLabSpec)
		if err != nil {
			return nil, err
		}
		p, err := l.Pair("h1", "inet")
		return []*Pair{p}, err
	},
	Tests: egressTests,
}
