// Package policy compiles intent into each node's desired datapath state.
// It is pure and deterministic: the same intent always yields byte-identical
// desired state, so the controller can write only what changed.
package policy

import (
	"fmt"
	"net/netip"
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
// own VMs and slivers, and the cluster-wide rules. A VM on a host whose agent has not
// reported its uplink yet is listed in pending (nobody can reach it yet).
func Compile(s State) (desired map[string]intent.Desired, pending []string) {
	nodeMAC := map[string]string{}
	for _, n := range s.Nodes {
		nodeMAC[n.Name] = n.UplinkMAC
	}
	vms := append([]intent.VM(nil), s.VMs...)
	sort.Slice(vms, func(i, j int) bool {
		return vms[i].IP < vms[j].IP || (vms[i].IP == vms[j].IP && vms[i].FullName() < vms[j].FullName())
	})

	visibility := Visibility(s.Farms, s.Subnets)
	var proxyARP []uint8
	for _, f := range s.Farms {
		if f.ProxyARP {
			proxyARP = append(proxyARP, f.ID)
		}
	}
	sort.Slice(proxyARP, func(i, j int) bool { return proxyARP[i] < proxyARP[j] })
	taps := tapRules(s)
	desired = map[string]intent.Desired{}
	for _, h := range s.Hosts {
		d := intent.Desired{Node: h.Name, VMNet: TenantNet, Local: []intent.LocalEndpoint{}, ProxyARPFarms: proxyARP}
		farms := map[uint8]bool{}
		for _, vm := range vms {
			if vm.Host == h.Name {
				d.Local = append(d.Local, intent.LocalEndpoint{Name: vm.FullName(), IP: vm.IP, MAC: vm.MAC, Interface: vm.Interface,
					Firewall: vm.Firewall})
				if ip, err := netip.ParseAddr(vm.IP); err == nil && ip.Is4() {
					farms[ip.As4()[1]] = true
				}
			}
		}
		d.Visibility = visibleFrom(visibility, farms)
		d.Slivers = localSlivers(s.Slivers, h.Name)
		d.Taps = localTaps(taps, vms, h.Name)
		desired[h.Name] = d
	}
	for _, vm := range vms {
		if _, ok := nodeMAC[vm.Host]; !ok {
			pending = append(pending, fmt.Sprintf("%s (host %s has no agent yet)", vm.FullName(), vm.Host))
		}
	}
	return desired, pending
}

// localSlivers are host's slivers, by slot (then name, so that even
// intent the controller never writes compiles the same every time), each
// with its own copy of its leases.
func localSlivers(all []intent.Sliver, host string) []intent.LocalSliver {
	var out []intent.LocalSliver
	for _, s := range all {
		if s.Host == host {
			out = append(out, intent.LocalSliver{Name: s.Name, Slot: s.Slot, Leases: append([]intent.Lease(nil), s.Leases...)})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Slot < out[j].Slot || (out[i].Slot == out[j].Slot && out[i].Name < out[j].Name)
	})
	return out
}

// tapRules compiles every TAP policy into its rules (one per direction),
// by ID. A policy today's intent cannot enforce (a VM it names is gone, a
// peering it relied on withdrawn) compiles to none: it copies nothing
// rather than copying to the wrong place.
func tapRules(s State) []intent.TapRule {
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

// localTaps are the rules host plays a part in: as the sender's edge (one
// of its VMs may be the rule's sender) or as the monitor's edge.
func localTaps(rules []intent.TapRule, vms []intent.VM, host string) []intent.TapRule {
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

// visibleFrom keeps the rules a host with VMs of these farms can use: a
// host checks a rule only for a packet from or to one of its own VMs, so a
// rule between two farms it holds no VM of is of no use to it, and would
// take room in its map and move its epoch for nothing.
func visibleFrom(rules []intent.VisRule, farms map[uint8]bool) []intent.VisRule {
	out := []intent.VisRule{}
	for _, r := range rules {
		if farms[r.SrcFarm] || farms[r.DstFarm] {
			out = append(out, r)
		}
	}
	return out
}
