package lab

import (
	"context"
	"slices"
	"sort"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/store"
)

// Report is what `lab status` shows.
type Report struct {
	Name     string       `json:"name"`
	Phase    string       `json:"phase"`
	Datapath string       `json:"datapath"`
	Topology string       `json:"topology"`
	StateDir string       `json:"stateDir"`
	Nodes    []NodeReport `json:"nodes"`
	// APIURL is the controller's REST API over TLS on the fabric.
	APIURL string `json:"apiURL,omitempty"`
}

// NodeReport describes one namespace of the lab.
type NodeReport struct {
	Name       string              `json:"name"`
	Kind       string              `json:"kind"` // fabric, controller, host, external, vm or sliver (see kinds)
	Netns      string              `json:"netns"`
	Present    bool                `json:"present"`
	Interfaces []InterfaceReport   `json:"interfaces"`
	Process    *ProcessReport      `json:"process,omitempty"`
	Agent      *intent.AgentStatus `json:"agent,omitempty"`
	VM         *intent.VM          `json:"vm,omitempty"`
	// VNAT says the node is a VNAT endpoint (vnat: true in the topology).
	VNAT bool `json:"vnat,omitempty"`
	// Sliver is a sliver's host and leases (and its slot, once the
	// controller has allocated it).
	Sliver *intent.Sliver `json:"sliver,omitempty"`
	// Cloud is a cloud-access node's role: EIDs, paths, RLOCs, rate.
	Cloud *CloudNode `json:"cloud,omitempty"`
}

// InterfaceReport is one interface of a node.
type InterfaceReport struct {
	Name  string   `json:"name"`
	MAC   string   `json:"mac"`
	Up    bool     `json:"up"`
	Addrs []string `json:"addrs"`
}

// ProcessReport is the daemon running on a node.
type ProcessReport struct {
	Name  string `json:"name"`
	PID   int    `json:"pid"`
	Alive bool   `json:"alive"`
	Log   string `json:"log"`
}

// statusFacts is what lab status learns from the controller's store, for
// the kinds to report from.
type statusFacts struct {
	agents  map[string]*intent.AgentStatus
	vms     map[string]*intent.VM
	slivers map[string]*intent.Sliver
}

// Status reports on every node of the lab, reading the namespaces and, when
// the controller is reachable, the agents' reports and VM allocations.
func Status(ctx context.Context, st *State) *Report {
	r := &Report{Name: st.Name, Phase: st.Phase, Datapath: st.Datapath, Topology: st.Topology, StateDir: st.Dir, APIURL: st.APIURL}
	f := &statusFacts{agents: map[string]*intent.AgentStatus{}, vms: map[string]*intent.VM{}, slivers: map[string]*intent.Sliver{}}
	// By node; the controller's record of a VM replaces the lab's below
	// (it may have moved since), found by FARM/VM as a VM keeps its farm
	// and name when it moves.
	nodeOfVM := map[string]string{}
	for i := range st.VMs {
		node := st.VMNode(st.VMs[i])
		f.vms[node] = &st.VMs[i]
		nodeOfVM[st.VMs[i].Farm+"/"+st.VMs[i].Name] = node
	}
	for i := range st.Slivers {
		f.slivers[st.Slivers[i].Name] = &st.Slivers[i]
	}
	// Only an onehop lab has a controller to ask (a bridge lab has none).
	if st.EtcdSocket != "" && st.Datapath != "bridge" {
		if s, err := store.DialEtcd([]string{"unix://" + st.EtcdSocket}); err == nil {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			if sts, _, err := store.ListJSON[intent.AgentStatus](cctx, s, intent.StatusPrefix); err == nil {
				for i := range sts {
					f.agents[sts[i].Node] = &sts[i]
				}
			}
			if vs, _, err := store.ListJSON[intent.VM](cctx, s, intent.VMsPrefix); err == nil {
				for i := range vs {
					if node, ok := nodeOfVM[vs[i].Farm+"/"+vs[i].Name]; ok {
						f.vms[node] = &vs[i]
					}
				}
			}
			// The controller's record has the slot; sliver names are
			// unique in a lab, so one of another host is not this one.
			if ss, _, err := store.ListJSON[intent.Sliver](cctx, s, intent.SliversPrefix); err == nil {
				for i := range ss {
					if mine, ok := f.slivers[ss[i].Name]; ok && mine.Host == ss[i].Host {
						f.slivers[ss[i].Name] = &ss[i]
					}
				}
			}
			cancel()
			s.Close()
		}
	}
	procs := map[string]Process{}
	for _, p := range st.Processes {
		procs[p.Node] = p
	}
	for _, ns := range st.Namespaces {
		node := nodeOf(st.Name, ns)
		n := NodeReport{Name: node, Netns: ns, Present: netns.Exists(ns), Kind: st.Kinds[node]}
		n.VNAT = slices.Contains(st.VNAT, node)
		n.Cloud = st.Cloud[node]
		if rep, ok := kindNamed(n.Kind).(reporter); ok {
			rep.report(&n, f)
		}
		if p, ok := procs[node]; ok {
			n.Process = &ProcessReport{Name: p.Name, PID: p.PID, Alive: alive(p.PID), Log: p.Log}
		}
		if n.Present {
			n.Interfaces = interfaces(ns)
		}
		r.Nodes = append(r.Nodes, n)
	}
	return r
}

func interfaces(ns string) []InterfaceReport {
	h, err := netns.Handle(ns)
	if err != nil {
		return nil
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil
	}
	var out []InterfaceReport
	for _, l := range links {
		a := l.Attrs()
		if a.Name == "lo" {
			continue
		}
		ir := InterfaceReport{Name: a.Name, MAC: a.HardwareAddr.String(), Up: a.OperState.String() == "up" || a.Flags&1 != 0, Addrs: []string{}}
		addrs, _ := h.AddrList(l, 2 /* AF_INET */)
		for _, ad := range addrs {
			ir.Addrs = append(ir.Addrs, ad.IPNet.String())
		}
		out = append(out, ir)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
