package portspace

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/onehop/onehop/internal/bpfobj"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/trace"
)

// Port space's map records (bpf/lib/portspace_maps.h), generated from the C.
// Only the feature's sync reads and writes them; Plan's Uplink, Sliver and
// Vif are what it compiles them from.
type (
	uplinkRecord   = portspacePortspaceUplink    // one uplink and the public address its slivers share
	sliverRecord   = portspacePortspaceSliver    // a sliver by slot: its links per uplink, its echo-id ranges
	vifRecord      = portspacePortspaceVif       // a sliver's host-side link: whose, for which uplink, its MAC
	limitsRecord   = portspacePortspaceLimits    // the per-sliver shares of the fragment and echo records
	shareRecord    = portspacePortspaceShare     // one sliver's buckets
	countersRecord = portspacePortspaceCounters  // one sliver's counters on one CPU
	fanoutKey      = portspacePortspaceFanoutKey // (uplink, i) in the ARP fan-out lists
)

// Indexes of limitsRecord's and shareRecord's arrays.
const (
	shareFrags = int(portspacePortspaceShareKindPORTSPACE_SHARE_FRAGS)
	shareEcho  = int(portspacePortspaceShareKindPORTSPACE_SHARE_ECHO)
)

// Kernel is port space's programs in the running kernel, loaded on the
// router's pinned maps: the sliver program (on every sliver link's tcx
// ingress and lo's tcx egress) and the socket programs (on the slivers'
// cgroup), with the links that attach them, kept apart from the router's so
// its Apply leaves them be.
type Kernel struct {
	router *datapath.Kernel
	objs   portspaceObjects
	sock   portspaceSockObjects
	links  *bpfobj.Links
	trace  tracer // the sliver program's trace instance (trace.go)

	closeOnce sync.Once
	closeErr  error
}

// linkDir is where port space's links are pinned, beside the router's.
const linkDir = "portspace-links"

// Open loads port space's programs on router's maps. Their handles are
// closed with router's (or before, by Close); links pinned by an earlier
// agent are taken over as the programs are attached.
func Open(router *datapath.Kernel) (*Kernel, error) { return open(router, false) }

// open is Open; testHooks loads the programs built with ONEHOP_TEST_HOOKS
// (every redirect logged), for BPF_PROG_RUN tests.
func open(router *datapath.Kernel, testHooks bool) (*Kernel, error) {
	load := loadPortspace
	if testHooks {
		load = loadPortspaceTest
	}
	dir := ""
	if router.PinDir() != "" {
		dir = filepath.Join(router.PinDir(), linkDir)
	}
	k := &Kernel{router: router, links: bpfobj.NewLinks(dir)}
	shared := router.Maps()
	for _, o := range []struct {
		load func() (*ebpf.CollectionSpec, error)
		objs any
		what string
	}{
		{load, &k.objs, "sliver"},
		{loadPortspaceSock, &k.sock, "sliver socket"},
	} {
		spec, err := o.load()
		if err == nil {
			err = bpfobj.LoadOn(spec, o.objs, shared, o.what, "vif")
		}
		if err != nil {
			k.Close()
			return nil, err
		}
	}
	router.CloseWith(k)
	router.TraceWith(trace.ProgramSliver, k.Trace)
	return k, nil
}

// Close releases this process's handles; pinned links stay.
func (k *Kernel) Close() error {
	k.closeOnce.Do(func() {
		k.closeErr = errors.Join(k.links.Close(), k.sock.Close(), k.objs.Close())
	})
	return k.closeErr
}

// SliverProgram is the program on sliver links (BPF_PROG_RUN tests).
func (k *Kernel) SliverProgram() *ebpf.Program { return k.objs.SliverIngress }

// LoopbackProgram is the program on lo's egress (BPF_PROG_RUN tests).
func (k *Kernel) LoopbackProgram() *ebpf.Program { return k.objs.LoopbackEgress }

// AttachSliver puts the sliver program on the tcx ingress of ifname, the
// host-side end of a sliver's link (pinned, like a vif's).
func (k *Kernel) AttachSliver(ifname string, ifindex int) error {
	return k.links.TCX("sliver-"+ifname, ifname, ifindex, k.objs.SliverIngress, ebpf.AttachTCXIngress)
}

// DetachSliver takes the sliver program off ifname (a link that is gone
// loses it with the link; the pin goes too).
func (k *Kernel) DetachSliver(ifname string) error {
	return k.links.Detach("sliver-" + ifname)
}

// SliverLinks lists the sliver links the program sits on, by name,
// including those pinned by an earlier agent.
func (k *Kernel) SliverLinks() ([]string, error) {
	names, err := k.links.Names()
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
	return k.links.TCX("lo-egress", "lo", lo.Index, k.objs.LoopbackEgress, ebpf.AttachTCXEgress)
}

// DetachLoopback takes the loopback program off lo.
func (k *Kernel) DetachLoopback() error { return k.links.Detach("lo-egress") }

// cgroupProg is a socket program on the slivers' cgroup, by its link's name.
type cgroupProg struct {
	name string
	prog *ebpf.Program
	at   ebpf.AttachType
}

func (k *Kernel) cgroupProgs() []cgroupProg {
	return []cgroupProg{
		{"cgroup-bind4", k.sock.SliverBind4, ebpf.AttachCGroupInet4Bind},
		{"cgroup-post-bind4", k.sock.SliverPostBind4, ebpf.AttachCGroupInet4PostBind},
		{"cgroup-connect4", k.sock.SliverConnect4, ebpf.AttachCGroupInet4Connect},
	}
}

// AttachSliverCgroups attaches the socket programs (bind, post-bind,
// connect) at dir, the cgroup v2 directory whose children are the
// slivers' cgroups; links are pinned so they outlive the agent.
func (k *Kernel) AttachSliverCgroups(dir string) error {
	for _, p := range k.cgroupProgs() {
		err := k.links.Attach(p.name, p.prog, nil, func() (link.Link, error) {
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
	for _, p := range k.cgroupProgs() {
		errs = append(errs, k.links.Detach(p.name))
	}
	return errors.Join(errs...)
}

// dropName names the i-th per-sliver drop counter (countersRecord.Drops)
// as router's drop metrics do: [0] is malformed, then every port-space drop
// reason in the C's order. "" for a slot no reason uses.
func dropName(router *datapath.Kernel, i int) string {
	if i == 0 {
		return "malformed"
	}
	code := uint32(portspaceDropReasonDROP_PS_NO_SLIVER) + uint32(i) - 1
	if code > uint32(portspaceDropReasonDROP_PS_OVER_SHARE) {
		return ""
	}
	return router.DropReason(code)
}

// cgroupID is the id of the cgroup v2 directory dir, as
// bpf_get_current_cgroup_id gives it: the directory's inode number.
func cgroupID(dir string) (uint64, error) {
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
