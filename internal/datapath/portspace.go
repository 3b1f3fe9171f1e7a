package datapath

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Port space's map records (bpf/lib/portspace_maps.h), generated from the C.
type (
	// PsUplink is one uplink and the public address its slivers share.
	PsUplink = sliverPsUplink
	// PsSliver is a sliver by slot: its links per uplink, its echo-id ranges.
	PsSliver = sliverPsSliver
	// PsVif is a sliver's host-side link: whose, for which uplink, its MAC.
	PsVif = sliverPsVif
	// PsLimits are the per-sliver shares of the fragment and echo records.
	PsLimits = sliverPsLimits
	// PsShare is one sliver's buckets.
	PsShare = sliverPsShare
	// PsCounters are one sliver's counters on one CPU.
	PsCounters = sliverPsCounters
	// PsFanoutKey is (uplink, i) in the ARP fan-out lists.
	PsFanoutKey = sliverPsFanoutKey
	// PsEchoKey and PsEcho are an echo request a sliver sent.
	PsEchoKey = sliverPsEchoKey
	// PsEcho is who sent it and the id it chose.
	PsEcho = sliverPsEcho
	// PsFragKey and PsFrag are a fragmented datagram to or from a sliver.
	PsFragKey = sliverPsFragKey
	// PsFrag is where its later fragments go and since when.
	PsFrag = sliverPsFrag
)

const (
	// FeaturePortspace is port space's bit in node_config.features.
	FeaturePortspace = uint32(vifFeatureBitFEATURE_PORTSPACE)
	// PsShareFrags and PsShareEcho index PsLimits and PsShare.
	PsShareFrags = int(sliverPsShareKindPS_SHARE_FRAGS)
	PsShareEcho  = int(sliverPsShareKindPS_SHARE_ECHO)
)

// PsDropName names the i-th per-sliver drop counter (PsCounters.Drops):
// [0] is malformed, then every port-space drop reason in the C's order.
// "" for a slot no reason uses.
func (k *Kernel) PsDropName(i int) string {
	if i == 0 {
		return "malformed"
	}
	code := uint32(vifDropReasonDROP_PS_NO_SLIVER) + uint32(i) - 1
	if code > uint32(vifDropReasonDROP_PS_OVER_SHARE) {
		return ""
	}
	return k.DropReason(code)
}

// SliverProgram is the program on sliver links (BPF_PROG_RUN tests).
func (k *Kernel) SliverProgram() *ebpf.Program { return k.sliver.SliverIngress }

// LoopbackProgram is the program on lo's egress (BPF_PROG_RUN tests).
func (k *Kernel) LoopbackProgram() *ebpf.Program { return k.sliver.LoopbackEgress }

const psLinkDir = "portspace-links"

// AttachSliver puts the sliver program on the tcx ingress of ifname, the
// host-side end of a sliver's link (pinned, like a vif's).
func (k *Kernel) AttachSliver(ifname string, ifindex int) error {
	return k.psLinks.TCX("sliver-"+ifname, ifname, ifindex, k.sliver.SliverIngress, ebpf.AttachTCXIngress)
}

// DetachSliver takes the sliver program off ifname (a link that is gone
// loses it with the link; the pin goes too).
func (k *Kernel) DetachSliver(ifname string) error {
	return k.psLinks.Detach("sliver-" + ifname)
}

// SliverLinks lists the sliver links the program sits on, by name,
// including those pinned by an earlier agent.
func (k *Kernel) SliverLinks() ([]string, error) {
	names, err := k.psLinks.Names()
	if err != nil {
		return nil, fmt.Errorf("sliver links: %w", err)
	}
	var out []string
	for _, name := range names {
		if n, ok := strings.CutPrefix(name, "sliver-"); ok && n != "" {
			out = append(out, n)
		}
	}
	return out, nil
}

// AttachLoopback puts the loopback program on lo's tcx egress: the host's
// own packets to a public address and a leased port reach the sliver.
func (k *Kernel) AttachLoopback() error {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	return k.psLinks.TCX("lo-egress", "lo", lo.Index, k.sliver.LoopbackEgress, ebpf.AttachTCXEgress)
}

// DetachLoopback takes the loopback program off lo.
func (k *Kernel) DetachLoopback() error { return k.psLinks.Detach("lo-egress") }

// sliverCgroupProgs are the socket programs on the slivers' cgroup, by the
// name of their link.
func (k *Kernel) sliverCgroupProgs() []struct {
	name string
	prog *ebpf.Program
	at   ebpf.AttachType
} {
	return []struct {
		name string
		prog *ebpf.Program
		at   ebpf.AttachType
	}{
		{"cgroup-bind4", k.sock.SliverBind4, ebpf.AttachCGroupInet4Bind},
		{"cgroup-post-bind4", k.sock.SliverPostBind4, ebpf.AttachCGroupInet4PostBind},
		{"cgroup-connect4", k.sock.SliverConnect4, ebpf.AttachCGroupInet4Connect},
	}
}

// AttachSliverCgroups attaches the socket programs (bind, post-bind,
// connect) at dir, the cgroup v2 directory whose children are the
// slivers' cgroups; links are pinned so they outlive the agent.
func (k *Kernel) AttachSliverCgroups(dir string) error {
	for _, p := range k.sliverCgroupProgs() {
		err := k.psLinks.Attach(p.name, p.prog, nil, func() (link.Link, error) {
			l, err := link.AttachCgroup(link.CgroupOptions{Path: dir, Attach: p.at, Program: p.prog})
			if err != nil {
				return nil, fmt.Errorf("attach %s to cgroup %s: %w", p.name, dir, err)
			}
			return l, nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// DetachSliverCgroups takes the socket programs off the slivers' cgroups.
func (k *Kernel) DetachSliverCgroups() error {
	var errs []error
	for _, p := range k.sliverCgroupProgs() {
		errs = append(errs, k.psLinks.Detach(p.name))
	}
	return errors.Join(errs...)
}

// CgroupID is the id of the cgroup v2 directory dir, as
// bpf_get_current_cgroup_id gives it: the directory's inode number.
func CgroupID(dir string) (uint64, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", dir, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, fmt.Errorf("cgroup %s: no inode number", dir)
	}
	return st.Ino, nil
}

// OpenTestObjects loads the objects built with ONEHOP_TEST_HOOKS (every
// redirect logged in each program's redirect_log), unpinned: for other
// packages' BPF_PROG_RUN tests (port space's sync and datapath). The agent
// never calls it.
func OpenTestObjects() (*Kernel, error) { return Open("", Options{testHooks: true}) }

// MapSizes is every map's size as compiled (the vif program defines them
// all), by its name in the C.
func MapSizes() (map[string]int, error) {
	spec, err := loadVif()
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for name, m := range spec.Maps {
		out[name] = int(m.MaxEntries)
	}
	return out, nil
}
