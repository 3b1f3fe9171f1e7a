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

// NamespaceOf returns the namespace name of a node of lab name.
func NamespaceOf(lab, node string) string { return "oh-" + lab + "-" + node }

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
