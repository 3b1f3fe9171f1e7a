package tap

import (
	"log/slog"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/ratelog"
)

// The copy rate each monitor may take by default (per target: a local
// monitor VM, or a remote monitor's host), and its burst. Copies enter the
// monitor through the per-CPU backlog production frames from VMs share; a
// bounded rate keeps a flood of copies from crowding production out.
const (
	DefaultCopyRate  = 250000 // copies a second
	DefaultCopyBurst = 512    // copies at once
)

// Feature is the virtual TAP as the agent runs it: Compile (pure,
// compile.go), Sync writing the plan into the datapath's maps, Stats
// reading the per-rule counters.
type Feature struct {
	k    *datapath.Kernel
	node string // the metrics' node label
	log  *slog.Logger
	rl   *ratelog.Logger

	rate, burst int // copies a second per target (0: unlimited), burst

	mu  sync.Mutex
	cur *state // what the maps hold; nil until first read
	// Slots, kept from pass to pass so a rule's counters stay its own.
	slotOf   map[uint32]uint32 // rule ID -> slot
	names    map[uint32]string // slot -> policy name
	targetOf map[target]uint32 // target -> slot
}

// New is the feature on the loaded datapath k (nil: an agent on a fake
// datapath, where only an empty plan syncs).
func New(k *datapath.Kernel) *Feature {
	return &Feature{k: k, rate: DefaultCopyRate, burst: DefaultCopyBurst,
		slotOf: map[uint32]uint32{}, names: map[uint32]string{}, targetOf: map[target]uint32{}}
}

// WithAgent gives the feature the agent's log and node name.
func (f *Feature) WithAgent(node string, log *slog.Logger) *Feature {
	f.node, f.log = node, log
	f.rl = ratelog.New(log, 1, time.Minute, time.Now)
	return f
}

// WithCopyRate sets how many copies a second each monitor may take, and
// how many at once (0: unlimited).
func (f *Feature) WithCopyRate(perSecond, burst int) *Feature {
	f.rate, f.burst = perSecond, burst
	return f
}

// Name implements feature.Feature.
func (f *Feature) Name() string { return "tap" }

// Bit implements feature.Feature: FEATURE_TAP in the C.
func (f *Feature) Bit() uint32 { return datapath.FeatureTap }

// Maps implements feature.Feature: every map of bpf/lib/tap_maps.h.
func (f *Feature) Maps() []feature.Map {
	rec := func(name string) feature.Map { return feature.Map{Name: name, Owner: feature.Reconciled} }
	own := func(name, lifetime string) feature.Map {
		return feature.Map{Name: name, Owner: feature.Datapath, Lifetime: lifetime}
	}
	return []feature.Map{
		rec(MapRules), rec(MapTargets), rec(MapIndex), rec(MapConfig),
		own(MapBuckets, "one GCRA bucket per target slot, zeroed when a target takes or leaves the slot"),
		own(MapScratch, "one per-CPU buffer a collector's copy is built in, holding nothing between packets"),
		own(MapStats, "per-CPU counters per rule slot, zeroed when a rule takes or leaves the slot"),
	}
}

// Compile implements feature.Feature (compile.go).
func (f *Feature) Compile(n feature.Node) (feature.Plan, error) {
	p, err := Compile(n)
	if err != nil {
		return nil, err
	}
	if len(p.Missing) > 0 && f.rl != nil {
		for _, m := range p.Missing {
			f.rl.Warn("missing-"+m.Policy, "a tap rule waits for its monitor", "policy", m.Policy, "id", m.ID, "why", m.Why)
		}
	}
	return p, nil
}
