// Package lab builds the embedded default: an emulated data center on one
// machine, out of network namespaces. A fabric namespace holds a Linux bridge
// (the flat L2 underlay); each host is a namespace with an uplink into it and
// an agent; each VM is a namespace behind a veth pair whose host end, the
// vif, lives in its host's namespace; the controller, with its embedded
// etcd, sits on the fabric like any management server.
//
// Each of those is a node kind (kind.go), one file each (kind_*.go); Up
// drives them all through the same steps. The shared plumbing is split by
// concern: namespaces and links (plumb.go), daemons and their arguments
// (process.go), the controller's allocations (alloc.go), and when a host's
// datapath is on a vif (ready.go).
package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/onehop/onehop/internal/intent"
)

// DefaultRoot is where labs keep their state, one directory per lab.
const DefaultRoot = "/run/onehop"

// State is what a lab records about itself, so that status, exec and down
// work from any later command and down can undo a half-built lab.
type State struct {
	Name       string   `json:"name"`
	Topology   string   `json:"topology"`
	Datapath   string   `json:"datapath"`
	Dir        string   `json:"dir"`
	BPFFS      string   `json:"bpffs"`
	EtcdSocket string   `json:"etcdSocket"`
	APISocket  string   `json:"apiSocket"`
	EtcdURL    string   `json:"etcdURL"`
	Phase      string   `json:"phase"` // "building" until up has finished, then "up"
	Namespaces []string `json:"namespaces"`
	// Kinds says what kind each node is: fabric, controller, host,
	// external, vm or sliver (see kinds in kind.go).
	Kinds map[string]string `json:"kinds"`
	// VMs are the VMs as built, with their addresses.
	VMs []intent.VM `json:"vms"`
	// Slivers are the slivers as built (lab up, or `sliver create`).
	Slivers []intent.Sliver `json:"slivers,omitempty"`
	// CgroupFS is where the lab mounts cgroup2 once a host or sliver needs
	// a cgroup (cgroup.go); "" until then.
	CgroupFS  string    `json:"cgroupFS,omitempty"`
	Processes []Process `json:"processes"`
	Created   time.Time `json:"created"`
	// Readdressed lists, per node given a new fabric address by
	// Readdress, every address it has had, the current one last: none of
	// them is handed out again (readdress.go).
	Readdressed map[string][]string `json:"readdressed,omitempty"`
	// VNAT names the nodes whose topology entry has vnat: true, the
	// endpoints that keep their connections across a change of address
	// (vnat.go).
	VNAT []string `json:"vnat,omitempty"`
	// APIURL is the REST API over TLS on the fabric (pki.go).
	APIURL string `json:"apiURL,omitempty"`
	// Cloud is what lab status shows of each cloud-access node (cloud.go).
	Cloud map[string]*CloudNode `json:"cloud,omitempty"`
}

// Process is a daemon the lab started.
type Process struct {
	Name  string   `json:"name"`
	Node  string   `json:"node"`
	Netns string   `json:"netns"`
	Args  []string `json:"args"` // onehop subcommand and flags
	PID   int      `json:"pid"`
	Log   string   `json:"log"`
	// Cgroup is the cgroup it runs in, for a process of a sliver ("" for
	// the daemons of hosts and the controller).
	Cgroup string `json:"cgroup,omitempty"`
}

// NamespaceOf returns the namespace name of a node of lab name. A VM whose
// name another farm's VM has too is node FARM/VM (topology.File.VMNode);
// its namespace is oh-LAB-FARM.VM, as a namespace is a file and no other
// node's name has a '.'.
func NamespaceOf(lab, node string) string { return "oh-" + lab + "-" + fileSafe(node) }

// nodeOf is the node whose namespace (NamespaceOf) ns is, in lab.
func nodeOf(lab, ns string) string {
	return strings.ReplaceAll(strings.TrimPrefix(ns, NamespaceOf(lab, "")), ".", "/")
}

// fileSafe is node as a part of a file's name: FARM/VM as FARM.VM.
func fileSafe(node string) string { return strings.ReplaceAll(node, "/", ".") }

// VMNode is the node of v, a VM of the lab: FARM/VM when the lab made it so
// (another farm has a VM of its name), else its name.
func (s *State) VMNode(v intent.VM) string {
	if q := v.Farm + "/" + v.Name; s.Kinds[q] == "vm" {
		return q
	}
	return v.Name
}

// Node resolves what a command names to a node of the lab: a node's own
// name (a host, a VM, FARM/VM), or a VM as FARM/VM or FARM/SUBNET/VM. A
// bare VM name that VMs of several farms have is refused, with them named.
func (s *State) Node(name string) (string, error) {
	if _, ok := s.Kinds[name]; ok {
		return name, nil
	}
	i, err := s.vm(name)
	if err != nil {
		return "", err
	}
	return s.VMNode(s.VMs[i]), nil
}

// vm finds the lab's VM that name (NAME, FARM/VM or FARM/SUBNET/VM) names,
// by its index in s.VMs.
func (s *State) vm(name string) (int, error) {
	parts := strings.Split(name, "/")
	var match []int
	for i, v := range s.VMs {
		switch {
		case len(parts) == 1 && v.Name == name,
			len(parts) == 2 && v.Farm+"/"+v.Name == name,
			len(parts) == 3 && v.FullName() == name:
			match = append(match, i)
		}
	}
	switch len(match) {
	case 1:
		return match[0], nil
	case 0:
		if len(parts) > 3 {
			return 0, fmt.Errorf("%q: a node is NAME, and a VM also FARM/VM or FARM/SUBNET/VM", name)
		}
		return 0, fmt.Errorf("lab %q has no node or VM %q; `onehop lab status` lists them", s.Name, name)
	}
	names := make([]string, len(match))
	for k, i := range match {
		names[k] = s.VMs[i].FullName()
	}
	return 0, fmt.Errorf("lab %q has %d VMs named %q, in different farms: say which, as FARM/VM or FARM/SUBNET/VM (%s)", s.Name, len(match), name, strings.Join(names, ", "))
}

func stateFile(dir string) string { return filepath.Join(dir, "lab.json") }

func (s *State) save() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := stateFile(s.Dir) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write lab state: %w", err)
	}
	return os.Rename(tmp, stateFile(s.Dir))
}

// Load reads the state of lab name under root.
func Load(root, name string) (*State, error) {
	b, err := os.ReadFile(stateFile(filepath.Join(root, name)))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no lab named %q is up (no state in %s)", name, filepath.Join(root, name))
	}
	if err != nil {
		return nil, fmt.Errorf("read lab state: %w", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("lab state %s is corrupt: %w", stateFile(filepath.Join(root, name)), err)
	}
	return &s, nil
}

// Names lists the labs that have state under root.
func Names(root string) []string {
	entries, _ := os.ReadDir(root)
	var out []string
	for _, e := range entries {
		if _, err := os.Stat(stateFile(filepath.Join(root, e.Name()))); err == nil {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// Resolve picks the lab a command is about: the one named, or the only one up.
func Resolve(root, name string) (string, error) {
	if name != "" {
		return name, nil
	}
	names := Names(root)
	switch len(names) {
	case 0:
		return "", fmt.Errorf("no lab is up (nothing in %s); start one with `onehop lab up FILE`", root)
	case 1:
		return names[0], nil
	}
	return "", fmt.Errorf("%d labs are up (%v); say which with --lab", len(names), names)
}
