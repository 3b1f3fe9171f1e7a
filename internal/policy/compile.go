// Package policy compiles intent into each node's desired datapath state.
// It is pure and deterministic: the same intent always yields byte-identical
// desired state, so the controller can write only what changed.
package policy

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/tappolicy"
)

// TenantNet is the address space every VM address lives in.
const TenantNet = "10.0.0.0/8"

// State is the whole intent plus what agents have reported.
type State struct {
	Hosts   []intent.Host
	Farms   []intent.Farm
	Subnets []intent.Subnet
	VMs     []intent.VM
	Nodes   []intent.Node
	Slivers []intent.Sliver
	Taps    []intent.TapPolicy
}

// Compile returns the desired state of every host, keyed by host name: its
// own VMs and slivers, the TAP rules it plays a part in, and the rules and
// proxy-ARP setting of the farms its VMs belong to. It is the reference the
// controller's incremental compile (which writes the same pieces as keys,
// intent/layout.go) and the agents' Assemble agree with: it encodes every
// piece and assembles it as an agent would. A VM on a host whose agent has
// not reported its uplink yet is listed in pending (nobody can reach it yet).
func Compile(s State) (desired map[string]intent.Desired, pending []string) {
	nodeMAC := map[string]string{}
	for _, n := range s.Nodes {
		nodeMAC[n.Name] = n.UplinkMAC
	}
	vms := append([]intent.VM(nil), s.VMs...)
	sort.Slice(vms, func(i, j int) bool {
		return vms[i].IP < vms[j].IP || (vms[i].IP == vms[j].IP && vms[i].FullName() < vms[j].FullName())
	})
	farms := FarmStates(s.Farms, s.Subnets)
	taps := TapRules(s)
	desired = map[string]intent.Desired{}
	for _, h := range s.Hosts {
		keys := intent.HostKeys{}
		var local []intent.VM
		for _, vm := range vms {
			if vm.Host == h.Name {
				local = append(local, vm)
				keys[intent.DesiredVMKey(h.Name, vm.FullName())] = mustJSON(LocalEndpoint(vm))
			}
		}
		for _, sl := range s.Slivers {
			if sl.Host == h.Name {
				keys[intent.DesiredSliverKey(h.Name, sl.Name)] = mustJSON(LocalSliver(sl))
			}
		}
		for _, r := range LocalTaps(taps, local, h.Name) {
			keys[intent.DesiredTapKey(h.Name, r.ID)] = mustJSON(r)
		}
		d, err := intent.Assemble(h.Name, keys, farms)
		if err != nil {
			panic(fmt.Sprintf("policy: assemble what it encoded: %v", err)) // a bug here, not bad input
		}
		desired[h.Name] = d
	}
	for _, vm := range vms {
		if _, ok := nodeMAC[vm.Host]; !ok {
			pending = append(pending, fmt.Sprintf("%s (host %s has no agent yet)", vm.FullName(), vm.Host))
		}
	}
	return desired, pending
}

// mustJSON encodes records of plain strings and numbers, which cannot fail.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("policy: encode %T: %v", v, err))
	}
	return b
}

// LocalEndpoint is a VM as its host's desired state holds it.
func LocalEndpoint(vm intent.VM) intent.LocalEndpoint {
	return intent.LocalEndpoint{Name: vm.FullName(), IP: vm.IP, MAC: vm.MAC, Interface: vm.Interface, Firewall: vm.Firewall.WithoutIDs(), Egress: vm.Egress,
		Published: vm.Published, Floating: vm.Floating}
}

// LocalSliver is a sliver as its host's desired state holds it, with its
// own copy of its leases.
func LocalSliver(s intent.Sliver) intent.LocalSliver {
	return intent.LocalSliver{Name: s.Name, Slot: s.Slot, Leases: append([]intent.Lease(nil), s.Leases...)}
}

// FarmStates compiles every farm's state, by id: its proxy-ARP setting and
// the rules from or to its subnets. Its cost grows with farms and rules,
// never with VMs.
func FarmStates(farms []intent.Farm, subnets []intent.Subnet) map[uint16]intent.FarmState {
	out := map[uint16]intent.FarmState{}
	for _, f := range farms {
		out[f.ID] = intent.FarmState{ID: f.ID, Name: f.Name, ProxyARP: f.ProxyARP, Visibility: []intent.VisRule{}}
	}
	for _, r := range Visibility(farms, subnets) {
		for _, id := range []uint16{r.SrcFarm, r.DstFarm} {
			f, ok := out[id]
			if !ok {
				continue
			}
			if n := len(f.Visibility); n == 0 || f.Visibility[n-1] != r {
				f.Visibility = append(f.Visibility, r)
			}
			out[id] = f
		}
	}
	return out
}

// TapRules compiles every TAP policy into its rules (one per direction),
// by ID. A policy today's intent cannot enforce (a VM it names is gone, a
// peering it relied on withdrawn) compiles to none: it copies nothing
// rather than copying to the wrong place.
func TapRules(s State) []intent.TapRule {
	if len(s.Taps) == 0 {
		return nil
	}
	w := tappolicy.NewWorld(s.Farms, s.Subnets, s.VMs)
	var out []intent.TapRule
	for _, p := range s.Taps {
		rules, err := w.Rules(p)
		if err != nil {
			continue // the controller checked it when written; what changed since is intent, not an error here
		}
		out = append(out, rules...)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].ID < out[j].ID || (out[i].ID == out[j].ID && out[i].Policy < out[j].Policy)
	})
	return out
}

// LocalTaps are the rules host plays a part in: as the sender's edge (one
// of vms, which may be host's VMs only, may be the rule's sender) or as the
// monitor's edge.
func LocalTaps(rules []intent.TapRule, vms []intent.VM, host string) []intent.TapRule {
	var out []intent.TapRule
	for _, r := range rules {
		if r.MonitorHost == host || slices.ContainsFunc(vms, func(v intent.VM) bool {
			return v.Host == host && tappolicy.Matches(r.Sender, v)
		}) {
			out = append(out, r)
		}
	}
	return out
}
