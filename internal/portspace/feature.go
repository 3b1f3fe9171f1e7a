package portspace

import (
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/ratelog"
)

// Feature is port space as the agent runs it: Compile (pure, compile.go),
// Sync writing the plan into the datapath's maps and putting the sliver
// program on the slivers' links, Stats reading the per-sliver counters.
type Feature struct {
	k *datapath.Kernel // the router, whose maps port space's are
	// cgroupDir is the parent of the slivers' cgroups ("": no socket
	// confinement): the socket programs sit there, and DIR/NAME is
	// sliver NAME's cgroup.
	cgroupDir string
	node      string // the metrics' node label
	// vifMAC reads a sliver link's own MAC (a frame for the host is
	// given it); tests set it. nil: the host's links, read once a pass.
	vifMAC func(ifindex int) (net.HardwareAddr, error)
	// links attaches the programs: the Kernel (Load); a recording fake in
	// the BPF_PROG_RUN tests, whose links are made up.
	links linker

	// confiner keeps each sliver's namespace to its lease (confine.go);
	// nil in tests of the maps alone.
	confiner *Confiner
	log      *slog.Logger
	rl       *ratelog.Logger

	// tables opens a reconciled map for writing; nil: the kernel's
	// (f.k.Map). Tests count or fail the writes through it.
	tables func(name string) (datapath.Table, error)

	mu    sync.Mutex
	cur   *state            // what the maps hold; nil until read (at start, after a failed write)
	names map[uint32]string // slot -> sliver name, as last synced
	// portsFrom are the leases portspace_ports was last made to hold exactly,
	// when portsKnown (not at start or after a failed write).
	portsFrom  []portLease
	portsKnown bool
	scratch    []uint32 // a pass's portspace_ports when its leases changed
}

// New is the feature on the router's loaded programs k (nil: an agent on a
// fake datapath, where only an empty plan syncs). Its own programs load
// on k's maps with Load.
func New(k *datapath.Kernel) *Feature {
	return &Feature{k: k, names: map[uint32]string{}}
}

// Load implements feature.Loader: port space's programs on the router's
// maps (Open), which Sync attaches. Nothing to load on a fake datapath.
func (f *Feature) Load() error {
	if f.k == nil || f.links != nil {
		return nil
	}
	k, err := Open(f.k)
	if err != nil {
		return fmt.Errorf("portspace: %w", err)
	}
	f.links = k
	return nil
}

// linker is what Sync needs of the kernel to attach the programs.
type linker interface {
	AttachSliver(ifname string, ifindex int) error
	DetachSliver(ifname string) error
	SliverLinks() ([]string, error)
	AttachLoopback() error
	DetachLoopback() error
	AttachSliverCgroups(dir string) error
	DetachSliverCgroups() error
}

// WithAgent gives the feature the agent's log and node name and has it
// confine each sliver's namespace to its lease (sysctls, routing for its
// own address, connections on lost ports cut) before its maps are synced.
func (f *Feature) WithAgent(node string, log *slog.Logger) *Feature {
	f.node, f.log = node, log
	f.confiner = NewConfiner(log)
	f.rl = ratelog.New(log, 1, time.Minute, time.Now)
	return f
}

// WithCgroups sets the parent of the slivers' cgroups (the agent's
// --sliver-cgroups): Sync attaches the socket programs there and maps
// each sliver's cgroup DIR/NAME to its slot.
func (f *Feature) WithCgroups(dir string) *Feature {
	f.cgroupDir = dir
	return f
}

// linkMACs reads every link of the host once and returns a lookup of a
// sliver link's MAC by ifindex. One lookup by index reads them all too
// (net.InterfaceByIndex lists every link and keeps one), so a pass that
// asked once per sliver link read the host's links as many times.
func linkMACs() (func(ifindex int) (net.HardwareAddr, error), error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	macs := make(map[int]net.HardwareAddr, len(ifs))
	for _, ifc := range ifs {
		macs[ifc.Index] = ifc.HardwareAddr
	}
	return func(ifindex int) (net.HardwareAddr, error) {
		mac, ok := macs[ifindex]
		if !ok {
			return nil, fmt.Errorf("sliver link %d: no such link", ifindex)
		}
		return mac, nil
	}, nil
}

// Name implements feature.Feature.
func (f *Feature) Name() string { return "portspace" }

// Bit implements feature.Feature: FEATURE_PORTSPACE in the C.
func (f *Feature) Bit() uint32 { return datapath.FeaturePortspace }

// Maps implements feature.Feature: every map of bpf/lib/portspace_maps.h.
func (f *Feature) Maps() []feature.Map {
	rec := func(name string) feature.Map { return feature.Map{Name: name, Owner: feature.Reconciled} }
	own := func(name, lifetime string) feature.Map {
		return feature.Map{Name: name, Owner: feature.Datapath, Lifetime: lifetime}
	}
	return []feature.Map{
		rec(MapUplinks), rec(mapUplinkIndex), rec(MapAddrs), rec(MapPorts), rec(MapSlivers),
		rec(MapVifs), rec(MapFanout), rec(MapCgroups), rec(mapConfig),
		own("portspace_frags", "LRU of 16384 datagrams; a record steers later fragments for 2 s; each sliver's new records are limited by its share"),
		own("portspace_echo_ids", "LRU of 16384 echo requests; each sliver's new records are limited by its share; a record delivers only while its id is in the sliver's lease"),
		own("portspace_shares", "one entry per slot, zeroed when a sliver takes the slot"),
		own("portspace_stats", "per-CPU counters per slot, zeroed when a sliver takes the slot"),
	}
}

// Compile implements feature.Feature (compile.go).
func (f *Feature) Compile(n feature.Node) (feature.Plan, error) {
	p, err := Compile(n)
	if err != nil {
		return nil, err
	}
	return p, nil
}
