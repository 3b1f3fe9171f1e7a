package main

import "context"

// router2Scenario: vm1 -> vm3 and vm4 -> vm5 at once through the routing
// namespace, the baseline of routed-2.
var router2Scenario = &Scenario{
	Name:        "router-2",
	Description: "lab " + bridgeLab.Name + ": vm1 -> vm3 and vm4 -> vm5 at once through " + netnsPrefix + routerNetns,
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := withRouter(ctx, e)
		if err != nil {
			return nil, err
		}
		return pairs(l, [2]string{"vm1", "vm3"}, [2]string{"vm4", "vm5"})
	},
}
