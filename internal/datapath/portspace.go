package datapath

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
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
	// PsMaxUplinks and PsMaxSlivers are the programs' limits, as sized
	// in the C (a test holds internal/portspace to them).
	PsMaxUplinks = 4
	PsMaxSlivers = 16384
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

// loadSharing loads one more object whose pinned maps are all the vif
// program's (by name), into objs.
func loadSharing(load func() (*ebpf.CollectionSpec, error), shared map[string]*ebpf.Map, objs any, what string) error {
	spec, err := load()
	if err != nil {
		return err
	}
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{}}
	for name, ms := range spec.Maps {
		if ms.Pinning == ebpf.PinNone {
			continue // its own (.bss, the test hooks' redirect log)
		}
		m, ok := shared[name]
		if !ok {
			return fmt.Errorf("%s program uses map %s, which the vif program does not share", what, name)
		}
		opts.MapReplacements[name] = m
		ms.MaxEntries = m.MaxEntries()
	}
	if err := spec.LoadAndAssign(objs, opts); err != nil {
		return fmt.Errorf("load %s program: %w", what, err)
	}
	return nil
}

// SliverProgram is the program on sliver links (BPF_PROG_RUN tests).
func (k *Kernel) SliverProgram() *ebpf.Program { return k.sliver.SliverIngress }

// LoopbackProgram is the program on lo's egress (BPF_PROG_RUN tests).
func (k *Kernel) LoopbackProgram() *ebpf.Program { return k.sliver.LoopbackEgress }

const psLinkDir = "portspace-links"

// AttachSliver puts the sliver program on the tcx ingress of ifname, the
// host-side end of a sliver's link (pinned, like a vif's).
func (k *Kernel) AttachSliver(ifname string, ifindex int) error {
	return k.attachTCX(k.psLinks, psLinkDir, "sliver-"+ifname, ifname, ifindex, k.sliver.SliverIngress, ebpf.AttachTCXIngress)
}

// DetachSliver takes the sliver program off ifname (a link that is gone
// loses it with the link; the pin goes too).
func (k *Kernel) DetachSliver(ifname string) error {
	return k.psDetach("sliver-" + ifname)
}

// SliverLinks lists the sliver links the program sits on, by name,
// including those pinned by an earlier agent.
func (k *Kernel) SliverLinks() ([]string, error) {
	seen := map[string]bool{}
	for name := range k.psLinks {
		if n, ok := cutPrefix(name, "sliver-"); ok {
			seen[n] = true
		}
	}
	if k.pinDir != "" {
		entries, err := os.ReadDir(filepath.Join(k.pinDir, psLinkDir))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("read sliver link pins: %w", err)
		}
		for _, de := range entries {
			if n, ok := cutPrefix(de.Name(), "sliver-"); ok {
				seen[n] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	return out, nil
}

func cutPrefix(s, p string) (string, bool) {
	if len(s) > len(p) && s[:len(p)] == p {
		return s[len(p):], true
	}
	return "", false
}

func (k *Kernel) psDetach(name string) error {
	if _, ok := k.psLinks[name]; ok {
		detachFrom(k.psLinks, k.pinDir != "", name)
		return nil
	}
	if k.pinDir == "" {
		return nil
	}
	pin := filepath.Join(k.pinDir, psLinkDir, name)
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		// A pin whose link went with its device: only the file is left.
		if rerr := os.Remove(pin); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return fmt.Errorf("remove pin %s: %w", pin, rerr)
		}
		return nil
	}
	l.Unpin()
	return l.Close()
}

// AttachLoopback puts the loopback program on lo's tcx egress: the host's
// own packets to a public address and a leased port reach the sliver.
func (k *Kernel) AttachLoopback() error {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	return k.attachTCX(k.psLinks, psLinkDir, "lo-egress", "lo", lo.Index, k.sliver.LoopbackEgress, ebpf.AttachTCXEgress)
}

// DetachLoopback takes the loopback program off lo.
func (k *Kernel) DetachLoopback() error { return k.psDetach("lo-egress") }

// AttachSliverCgroups attaches the socket programs (bind, post-bind,
// connect) at dir, the cgroup v2 directory whose children are the
// slivers' cgroups; links are pinned so they outlive the agent.
func (k *Kernel) AttachSliverCgroups(dir string) error {
	for _, p := range []struct {
		name string
		prog *ebpf.Program
		at   ebpf.AttachType
	}{
		{"cgroup-bind4", k.sock.SliverBind4, ebpf.AttachCGroupInet4Bind},
		{"cgroup-post-bind4", k.sock.SliverPostBind4, ebpf.AttachCGroupInet4PostBind},
		{"cgroup-connect4", k.sock.SliverConnect4, ebpf.AttachCGroupInet4Connect},
	} {
		if _, ok := k.psLinks[p.name]; ok {
			continue
		}
		pin := ""
		if k.pinDir != "" {
			pin = filepath.Join(k.pinDir, psLinkDir, p.name)
			if l, err := link.LoadPinnedLink(pin, nil); err == nil {
				if l.Update(p.prog) == nil {
					k.psLinks[p.name] = l
					continue
				}
				l.Unpin()
				l.Close()
			}
			if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
				return fmt.Errorf("pin dir: %w", err)
			}
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: dir, Attach: p.at, Program: p.prog})
		if err != nil {
			return fmt.Errorf("attach %s to cgroup %s: %w", p.name, dir, err)
		}
		if pin != "" {
			if err := l.Pin(pin); err != nil {
				l.Close()
				return fmt.Errorf("pin %s: %w", p.name, err)
			}
		}
		k.psLinks[p.name] = l
	}
	return nil
}

// DetachSliverCgroups takes the socket programs off the slivers' cgroups.
func (k *Kernel) DetachSliverCgroups() error {
	var errs []error
	for _, name := range []string{"cgroup-bind4", "cgroup-post-bind4", "cgroup-connect4"} {
		errs = append(errs, k.psDetach(name))
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
