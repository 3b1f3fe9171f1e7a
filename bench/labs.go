package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/onehop/onehop/internal/intent"
)

// The labs several scenarios share: the same two hosts, farms and VM
// placement, once with onehop's datapath and once built on Linux bridges,
// so that a figure of one lab has its counterpart in the other.

// labVMs places the VMs alike in both labs: vm1 and vm4 on h1 in subnet
// net; vm2 on h2 in net (the traffic crosses the fabric); vm3 and vm5 on h2
// in net2 (one-hop routing between subnets).
const labVMs = `vms:
  - {name: vm1, host: h1, subnet: bench/net}
  - {name: vm2, host: h2, subnet: bench/net}
  - {name: vm3, host: h2, subnet: bench/net2}
  - {name: vm4, host: h1, subnet: bench/net}
  - {name: vm5, host: h2, subnet: bench/net2}
`

// onehopLab runs onehop's eBPF datapath; net may reach net2.
var onehopLab = LabSpec{Name: "benchoh", Datapath: "onehop", Body: `farms:
  - name: bench
    subnets: [{name: net}, {name: net2}]
    rules: [{from: net, to: net2}]
` + labVMs}

// bridgeLab is the physical reference: a Linux bridge per host, no
// virtualization (no controller, no agents).
var bridgeLab = LabSpec{Name: "benchbr", Datapath: "bridge", Body: `farms:
  - name: bench
    subnets: [{name: net}, {name: net2}]
` + labVMs}

// intentVMs are the VMs in the intent of the lab whose API socket is api
// (`onehop get vms -o json`).
func intentVMs(ctx context.Context, e *Env, api string) ([]intent.VM, error) {
	out, err := output(e.onehop(ctx, "get", "vms", "-o", "json", "--api", api))
	if err != nil {
		return nil, err
	}
	var vms []intent.VM
	if err := json.Unmarshal(out, &vms); err != nil {
		return nil, fmt.Errorf("get vms -o json: %w", err)
	}
	return vms, nil
}
