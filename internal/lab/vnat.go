package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/onehop/onehop/internal/topology"
	"github.com/onehop/onehop/internal/vnatrelay"
)

// VNAT endpoints (issue 10, connection migration): a VM or external with
// vnat: true in the topology is an endpoint whose TCP and UDP connections
// survive a change of its address (lab move --subnet for a VM, lab readdress
// for an external). What makes them survive runs in the node itself, the
// VNAT daemon; the lab only records which nodes are endpoints (State.VNAT,
// shown by lab status) and starts the daemon in them, here.

// startVNAT is the one place a node's VNAT daemon is started: the start
// step of every kind that may carry vnat: true (vmKind, externalKind) calls
// it with the node's interface. It records the node as a VNAT endpoint, so
// that lab status shows it, and starts `onehop vnat run --iface IFACE` in
// the node's namespace (and its sliver cgroup, if it has one) as a lab
// process: lab down stops it with the others, its log is vnat-NODE.log.
func startVNAT(_ context.Context, b *builder, node, iface string) error {
	if slices.Contains(b.st.VNAT, node) {
		return nil
	}
	b.step("%s: VNAT endpoint on %s (onehop vnat run)", node, iface)
	b.st.VNAT = append(b.st.VNAT, node)
	if err := b.st.save(); err != nil {
		return err
	}
	pins, err := vnatPinDir(b.st, node)
	if err != nil {
		return err
	}
	return b.spawn("vnat-"+node, node, NamespaceOf(b.st.Name, node), vnatArgs(iface, locationServer(b.t, node), pins)...)
}

// locationServer is where node's VNAT daemon finds the location server,
// the controller (docs/vnat-location.md): an external, on the fabric, at
// the controller's fabric address; a VM, in tenant space, at the service
// address its host relays (internal/vnatrelay). A lab without a controller
// has none.
func locationServer(t *topology.File, node string) string {
	if t.Datapath != topology.DatapathOnehop || t.Fabric.Controller == "" {
		return ""
	}
	if _, ok := t.VMByNode(node); ok {
		return vnatrelay.Addr.String()
	}
	return t.Fabric.Controller
}

// vnatOf reports whether node of t is a VNAT endpoint.
func vnatOf(t *topology.File, node string) bool {
	if v, ok := t.VMByNode(node); ok {
		return v.VNAT
	}
	if e, ok := t.ExternalByName(node); ok {
		return e.VNAT
	}
	return false
}

// vnatPinDir is where node's VNAT daemon pins its maps and links, so that
// a restart of the daemon keeps the connections it translates. /sys/fs/bpf
// is not a bpffs inside `ip netns exec`, so it is a directory on the lab's
// own bpffs (which lab down unmounts, pins and all); "" (the daemon's own
// default) for a state without one.
func vnatPinDir(st *State, node string) (string, error) {
	if st.BPFFS == "" {
		return "", nil
	}
	if err := MountBPFFS(st.BPFFS); err != nil {
		return "", err
	}
	dir := filepath.Join(st.BPFFS, "vnat", fileSafe(node))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("%s: vnat pin directory: %w", node, err)
	}
	return dir, nil
}
