package main

import "context"

// tapLab is onehopLab with a monitor VM on h2 and a TAP policy copying
// everything vm1 sends vm2 to it: the copies cross the fabric, as to a
// monitor on another host.
var tapLab = LabSpec{Name: "benchtap", Datapath: "onehop", Body: `farms:
  - name: bench
    subnets: [{name: net}, {name: net2}]
    rules: [{from: net, to: net2}]
` + labVMs + `  - {name: mon, host: h2, subnet: bench/net}
taps:
  - {name: all, sender: bench/net/vm1, receiver: bench/net/vm2, monitor: bench/net/mon}
`}

// tappedScenario: vm1 on h1 -> vm2 on h2 as in onehop, with every packet
// copied to a monitor on h2.
var tappedScenario = &Scenario{
	Name:        "tapped",
	Description: "lab " + tapLab.Name + ": vm1 on h1 -> vm2 on h2, every packet also copied to monitor mon on h2 by a TAP policy",
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := e.Lab(ctx, tapLab)
		if err != nil {
			return nil, err
		}
		p, err := l.Pair("vm1", "vm2")
		return []*Pair{p}, err
	},
	Baselines: []Baseline{
		// Issue 9: production keeps its speed while it is copied (the
		// paper's switch lost 16-80%).
		{Scenario: "onehop", Targets: map[string]Target{"tcp": {Ratio: 0.9}, "udp64": {Ratio: 0.9}, "rtt": {Ratio: 1.1}}},
	},
}
