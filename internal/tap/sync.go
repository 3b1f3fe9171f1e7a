package tap

import (
	"errors"
	"fmt"
	"github.com/onehop/onehop/internal/tapwire"
	"net"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/limits"
)

// TAP's map records (bpf/lib/tap_maps.h), generated from the C (gen.go).
// Only Sync and Stats read and write them.
type (
	keyRecord      = tapTapKey      // a key of tap_index: an address (or segment, or any) on one side of one role's rules
	bitsRecord     = tapTapBits     // a set of rule slots
	ruleRecord     = tapTapRule     // a rule by slot: its filters and its monitor's target
	targetRecord   = tapTapTarget   // where one monitor's copies go
	limitsRecord   = tapTapLimits   // the copy rate each target may take
	countersRecord = tapTapCounters // one rule's copies on one CPU
)

// state is what the reconciled maps hold (arrays: only their non-zero
// entries). Sync keeps the last one it wrote and writes only what changed.
type state struct {
	rules   map[uint32]ruleRecord
	targets map[uint32]targetRecord
	index   map[keyRecord]bitsRecord
	config  map[uint32]limitsRecord
}

func newState() *state {
	return &state{rules: map[uint32]ruleRecord{}, targets: map[uint32]targetRecord{},
		index: map[keyRecord]bitsRecord{}, config: map[uint32]limitsRecord{}}
}

// Sync implements feature.Feature: the reconciled maps are made to hold
// exactly p, writing only what differs from what they hold. What a key
// points at is written before the key: targets, then rules, then the
// index; and the index lets go of a rule before its slot is cleared. A
// rule keeps its slot (and its counters) while it lives; a slot a rule
// takes or leaves starts from zero counters, so after a policy's delete
// nothing of it is left in any map.
func (f *Feature) Sync(fp feature.Plan) error {
	p, ok := fp.(Plan)
	if !ok {
		return fmt.Errorf("tap: plan of type %T", fp)
	}
	if f.k == nil {
		// An agent on a fake datapath (tests): nothing to write to.
		if !p.InUse() {
			return nil
		}
		return errors.New("tap: no datapath loaded")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.sync(p); err != nil {
		// What the maps hold is no longer known for sure: read it again
		// on the next pass.
		f.cur = nil
		return fmt.Errorf("tap: %w", err)
	}
	return nil
}

func (f *Feature) sync(p Plan) error {
	l, err := layoutOf(p)
	if err != nil {
		return err
	}
	if f.cur == nil {
		if f.cur, err = f.read(); err != nil {
			return err
		}
	}
	want, fresh, err := f.want(l, p.UplinkIfindex)
	if err != nil {
		return err
	}
	var maps struct{ rules, targets, index, config, buckets, stats *ebpf.Map }
	for _, m := range []struct {
		name string
		to   **ebpf.Map
	}{{MapRules, &maps.rules}, {MapTargets, &maps.targets}, {MapIndex, &maps.index}, {MapConfig, &maps.config},
		{MapBuckets, &maps.buckets}, {MapStats, &maps.stats}} {
		if *m.to, err = f.k.Map(m.name); err != nil {
			return err
		}
	}
	cur := f.cur
	// Slots taken anew start from nothing counted, before anything
	// points at them.
	for _, s := range fresh.rules {
		if err := zeroStats(maps.stats, s); err != nil {
			return err
		}
	}
	for _, t := range fresh.targets {
		if err := maps.buckets.Put(t, uint64(0)); err != nil {
			return fmt.Errorf("reset bucket of target %d: %w", t, err)
		}
	}
	steps := []func() error{
		func() error { return datapath.PutChanged(maps.config, cur.config, want.config, MapConfig) },
		func() error { return datapath.PutChanged(maps.targets, cur.targets, want.targets, MapTargets) },
		func() error { return datapath.PutChanged(maps.rules, cur.rules, want.rules, MapRules) },
		func() error { return datapath.PutChanged(maps.index, cur.index, want.index, MapIndex) },
		func() error { return datapath.RemoveGone(maps.index, cur.index, want.index, false, MapIndex) },
		func() error { return datapath.RemoveGone(maps.rules, cur.rules, want.rules, true, MapRules) },
		func() error { return datapath.RemoveGone(maps.targets, cur.targets, want.targets, true, MapTargets) },
		func() error { return datapath.RemoveGone(maps.config, cur.config, want.config, true, MapConfig) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	// Slots let go of: nothing of them stays.
	for _, s := range fresh.freedRules {
		if err := zeroStats(maps.stats, s); err != nil {
			return err
		}
	}
	for _, t := range fresh.freedTargets {
		if err := maps.buckets.Put(t, uint64(0)); err != nil {
			return fmt.Errorf("reset bucket of target %d: %w", t, err)
		}
	}
	return nil
}

// slotChanges are the slots a pass gives out and takes back.
type slotChanges struct {
	rules, targets           []uint32
	freedRules, freedTargets []uint32
}

// allocate gives each of keys a slot below limit: the one it has in had,
// else the lowest free, in the order of keys. It returns every key's slot,
// the slots given out anew and the slots of the keys of had that are gone;
// ok is false when keys do not fit. Rules and targets are both given slots
// this way.
func allocate[K comparable](keys []K, had map[K]uint32, limit uint32) (slotOf map[K]uint32, taken, freed []uint32, ok bool) {
	slotOf = map[K]uint32{}
	used := map[uint32]bool{}
	for _, k := range keys {
		if s, ok := had[k]; ok {
			slotOf[k], used[s] = s, true
		}
	}
	next := uint32(0)
	for _, k := range keys {
		if _, ok := slotOf[k]; ok {
			continue
		}
		for next < limit && used[next] {
			next++
		}
		if next >= limit {
			return nil, nil, nil, false
		}
		slotOf[k], used[next] = next, true
		taken = append(taken, next)
	}
	for k, s := range had {
		if _, ok := slotOf[k]; !ok {
			freed = append(freed, s)
		}
	}
	return slotOf, taken, freed, true
}

// want gives every rule and target a slot (keeping the ones they have)
// and packs the entries for the datapath.
func (f *Feature) want(l layout, uplinkIfindex int) (*state, slotChanges, error) {
	var ch slotChanges
	// Rules: keep slots, free the gone, give the new the lowest free.
	ids := make([]uint32, 0, len(l.rules))
	for id := range l.rules {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	slotOf, taken, freed, ok := allocate(ids, f.slotOf, limits.MaxTapRules)
	if !ok {
		return nil, ch, fmt.Errorf("%d rules: more than %d", len(ids), limits.MaxTapRules)
	}
	ch.rules, ch.freedRules = taken, freed
	// Targets likewise.
	targetOf, taken, freed, ok := allocate(l.targets, f.targetOf, limits.MaxTapTargets)
	if !ok {
		return nil, ch, fmt.Errorf("%d monitors to copy to: more than %d", len(l.targets), limits.MaxTapTargets)
	}
	ch.targets, ch.freedTargets = taken, freed

	s := newState()
	for t, slot := range targetOf {
		tt := targetRecord{Ifindex: uint32(t.ifindex)}
		if t.col.addr != "" {
			hdr, err := t.col.header()
			if err != nil {
				return nil, ch, fmt.Errorf("target %s: %w", t, err)
			}
			tt.Remote, tt.Encap, tt.Hdr = 1, encapKinds[t.col.encap], hdr
		} else if t.hostMAC != "" {
			mac, err := net.ParseMAC(t.hostMAC)
			if err != nil {
				return nil, ch, fmt.Errorf("target %s: %w", t, err)
			}
			tt.Remote = 1
			copy(tt.HostMac[:], mac)
			tt.Ifindex = 0 // the uplink's, from the node's config below
		}
		s.targets[slot] = tt
	}
	names := map[uint32]string{}
	for id, r := range l.rules {
		slot := slotOf[id]
		e := ruleRecord{Id: id, Target: targetOf[r.target], Proto: r.Proto}
		if r.hasPorts() {
			e.Ports = 1
			e.SportLo, e.SportHi, e.DportLo, e.DportHi = r.SportLo, r.SportHi, r.DportLo, r.DportHi
			if e.SportLo == 0 && e.SportHi == 0 {
				e.SportHi = 65535
			}
			if e.DportLo == 0 && e.DportHi == 0 {
				e.DportHi = 65535
			}
		}
		s.rules[slot] = e
		names[slot] = r.Policy
	}
	for k, ids := range l.index {
		var b bitsRecord
		for _, id := range ids {
			slot := slotOf[id]
			b.W[slot/64] |= 1 << (slot % 64)
		}
		s.index[keyRecord{Addr: datapath.IPKey(k.addr), Role: k.role, Side: k.side, Kind: k.kind}] = b
	}
	if len(l.rules) > 0 {
		var lim limitsRecord
		if f.rate > 0 {
			interval := time.Second / time.Duration(f.rate)
			lim.IntervalNs = uint64(interval)
			lim.BurstNs = uint64(interval) * uint64(max(f.burst, 1))
		}
		// Slot 0 present even when unlimited: "in use" is told by rules.
		s.config[0] = lim
	}
	// Remote targets go out of the node's uplink.
	for slot, t := range s.targets {
		if t.Remote == 1 {
			if uplinkIfindex == 0 {
				return nil, ch, errors.New("no uplink: copies to other hosts cannot leave")
			}
			t.Ifindex = uint32(uplinkIfindex)
			s.targets[slot] = t
		}
	}
	f.slotOf, f.targetOf, f.names = slotOf, targetOf, names
	return s, ch, nil
}

// header is the collector's outer headers (EncapHeader).
func (c collectorTarget) header() ([72]uint8, error) {
	srcMAC, err1 := net.ParseMAC(c.srcMAC)
	dstMAC, err2 := net.ParseMAC(c.mac)
	src, err3 := netip.ParseAddr(c.src)
	dst, err4 := netip.ParseAddr(c.addr)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return [72]uint8{}, err
	}
	h, _, err := tapwire.EncapHeader(c.encap, c.session, srcMAC, dstMAC, src, dst)
	return h, err
}

func zeroStats(m *ebpf.Map, slot uint32) error {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("possible cpus: %w", err)
	}
	if err := m.Put(slot, make([]countersRecord, cpus)); err != nil {
		return fmt.Errorf("reset counters of rule slot %d: %w", slot, err)
	}
	return nil
}

// read takes what the maps hold (once, when the feature starts: an agent
// restart finds the maps its predecessor wrote), and the slots in them.
func (f *Feature) read() (*state, error) {
	s := newState()
	if err := datapath.ReadMap(f.k, MapRules, s.rules); err != nil {
		return nil, err
	}
	if err := datapath.ReadMap(f.k, MapTargets, s.targets); err != nil {
		return nil, err
	}
	if err := datapath.ReadMap(f.k, MapIndex, s.index); err != nil {
		return nil, err
	}
	if err := datapath.ReadMap(f.k, MapConfig, s.config); err != nil {
		return nil, err
	}
	f.slotOf, f.targetOf, f.names = map[uint32]uint32{}, map[target]uint32{}, map[uint32]string{}
	for slot, r := range s.rules {
		f.slotOf[r.Id] = slot
		f.names[slot] = fmt.Sprintf("id %d", r.Id) // named again by the next pass
	}
	for slot, t := range s.targets {
		if t.Encap != 0 {
			// Named by no plan: the next pass gives the collector a
			// slot anew, and this one is reset and freed.
			f.targetOf[target{col: collectorTarget{addr: fmt.Sprintf("read from slot %d", slot)}}] = slot
		} else if t.Remote == 1 {
			f.targetOf[target{hostMAC: strings.ToLower(net.HardwareAddr(t.HostMac[:]).String())}] = slot
		} else {
			f.targetOf[target{ifindex: int(t.Ifindex)}] = slot
		}
	}
	return s, nil
}

// Stats reads each synced rule's counters, summed over CPUs: Packets and
// Bytes are copies made at the sender's edge plus copies delivered at the
// monitor's edge (one rule may be both on one node: a copy is counted at
// the one edge that handed it on), Dropped the copies lost.
func (f *Feature) Stats() ([]intent.TapStats, error) {
	if f.k == nil {
		return nil, nil
	}
	f.mu.Lock()
	type rule struct {
		slot uint32
		id   uint32
		name string
	}
	var rules []rule
	for id, slot := range f.slotOf {
		rules = append(rules, rule{slot, id, f.names[slot]})
	}
	f.mu.Unlock()
	sort.Slice(rules, func(i, j int) bool { return rules[i].id < rules[j].id })
	m, err := f.k.Map(MapStats)
	if err != nil {
		return nil, err
	}
	out := make([]intent.TapStats, 0, len(rules))
	for _, r := range rules {
		var per []countersRecord
		if err := m.Lookup(r.slot, &per); err != nil {
			return nil, fmt.Errorf("read counters of tap rule %d: %w", r.id, err)
		}
		st := intent.TapStats{Policy: r.name, ID: r.id}
		for _, c := range per {
			st.Packets += c.CopiedPackets + c.DeliveredPackets
			st.Bytes += c.CopiedBytes + c.DeliveredBytes
			st.Dropped += c.Dropped
		}
		out = append(out, st)
	}
	return out, nil
}
