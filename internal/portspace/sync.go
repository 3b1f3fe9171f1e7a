package portspace

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/cilium/ebpf"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/limits"
)

// state is what the reconciled maps hold (arrays: only their non-zero
// entries). Sync keeps the last one it wrote, so a pass writes only what
// changed: rewriting 4×65536 port slots every pass would be too slow.
//
// portspace_ports is kept as the array it is (portKeys slots, 1 MiB), not as a
// Go map: with every port leased that map had 262,140 entries, and
// building and comparing it again took a pass ~35 ms although nothing
// had changed.
type state struct {
	uplinks map[uint32]uplinkRecord // by ifindex
	index   map[uint32]uplinkRecord // by uplink index
	addrs   map[uint32]uint32
	ports   []uint32 // by portKey: the slot leasing the port, 0 for none
	slivers map[uint32]sliverRecord
	vifs    map[uint32]vifRecord
	fanout  map[fanoutKey]uint32
	cgroups map[uint64]uint32
	limits  map[uint32]limitsRecord
}

// portKeys is how many slots portspace_ports has: every port of every uplink.
const portKeys = limits.MaxUplinks * 65536

// portKey is a port's slot in portspace_ports (bpf/lib/portspace.h's key).
func portKey(uplink int, port uint16) uint32 { return uint32(uplink)<<16 | uint32(port) }

// newState is an empty state; the ports array is made only for what
// the maps hold (cur), never for a pass's want.
func newState(withPorts bool) *state {
	s := &state{
		uplinks: map[uint32]uplinkRecord{}, index: map[uint32]uplinkRecord{},
		addrs: map[uint32]uint32{}, slivers: map[uint32]sliverRecord{},
		vifs: map[uint32]vifRecord{}, fanout: map[fanoutKey]uint32{},
		cgroups: map[uint64]uint32{}, limits: map[uint32]limitsRecord{},
	}
	if withPorts {
		s.ports = make([]uint32, portKeys)
	}
	return s
}

// portLease is one lease as portspace_ports holds it: whose ports are which.
type portLease struct {
	sliver string
	slot   uint32
	uplink int
	lo, hi uint16
}

// leasesOf lists p's leases in plan order: the whole of what portspace_ports is
// made from, so two plans with the same list need the same ports.
func leasesOf(p Plan) []portLease {
	var out []portLease
	for _, sl := range p.Slivers {
		for _, l := range sl.Leases {
			out = append(out, portLease{sliver: sl.Name, slot: sl.Slot, uplink: l.Uplink, lo: l.Lo, hi: l.Hi})
		}
	}
	return out
}

// portsOf fills into (portKeys long) with the slot of every leased port,
// refusing two slivers on one port. Leases were checked by want.
func portsOf(leases []portLease, into []uint32) error {
	clear(into)
	for _, l := range leases {
		for port := int(l.lo); port <= int(l.hi); port++ {
			key := portKey(l.uplink, uint16(port))
			if other := into[key]; other != 0 {
				return fmt.Errorf("sliver %s: port %d on uplink %d is also slot %d's", l.sliver, port, l.uplink, other)
			}
			into[key] = l.slot
		}
	}
	return nil
}

// Lifetimes the shares are sized from (bpf/lib/portspace_maps.h, portspace.h).
const (
	fragLifetime = 2 * time.Second
	// echoWindow: a sliver may fill its part of the echo table once in
	// this long (a ping sends one id for its whole run).
	echoWindow = 60 * time.Second
)

// limitsFor sizes each sliver's share of the two LRUs: together the slivers
// cannot add more records in a lifetime than the table holds, so no sliver
// evicts another's records while its own are fresh.
func limitsFor(slivers int, fragCap, echoCap int) limitsRecord {
	var l limitsRecord
	if slivers < 1 {
		slivers = 1
	}
	set := func(kind int, capacity int, window time.Duration) {
		per := capacity / slivers
		if per < 2 {
			per = 2
		}
		interval := window / time.Duration(per)
		l.IntervalNs[kind] = uint64(interval)
		l.BurstNs[kind] = uint64(interval) * uint64(per/2) // half its part at once
	}
	set(shareFrags, fragCap, fragLifetime)
	set(shareEcho, echoCap, echoWindow)
	return l
}

// want is the maps' content for p, portspace_ports apart (portsOf).
func (f *Feature) want(p Plan) (*state, map[string]int, error) {
	s := newState(false)
	attach := map[string]int{}
	bySlot := append([]Sliver(nil), p.Slivers...)
	sort.Slice(bySlot, func(i, j int) bool { return bySlot[i].Slot < bySlot[j].Slot })
	fan := map[int]uint32{}
	macOf := f.vifMAC
	if macOf == nil && len(p.Slivers) > 0 {
		var err error
		if macOf, err = linkMACs(); err != nil {
			return nil, nil, err
		}
	}
	for _, sl := range bySlot {
		if sl.Slot < 1 || sl.Slot > limits.MaxSlivers {
			return nil, nil, fmt.Errorf("sliver %s: slot %d outside 1..%d", sl.Name, sl.Slot, limits.MaxSlivers)
		}
		var rec sliverRecord
		for u := range rec.EchoLo {
			rec.EchoLo[u], rec.EchoHi[u] = 1, 0 // none
		}
		for _, l := range sl.Leases {
			if l.Uplink < 0 || l.Uplink >= limits.MaxUplinks || l.Lo > l.Hi {
				return nil, nil, fmt.Errorf("sliver %s: lease %d-%d on uplink %d is not a range on an uplink 0..%d", sl.Name, l.Lo, l.Hi, l.Uplink, limits.MaxUplinks-1)
			}
			// Rewritten echo ids come from its lowest lease on the uplink.
			if rec.EchoLo[l.Uplink] > rec.EchoHi[l.Uplink] || l.Lo < rec.EchoLo[l.Uplink] {
				rec.EchoLo[l.Uplink], rec.EchoHi[l.Uplink] = l.Lo, l.Hi
			}
		}
		for _, v := range sl.Vifs {
			if v.Uplink < 0 || v.Uplink >= limits.MaxUplinks || v.Ifindex <= 0 {
				return nil, nil, fmt.Errorf("sliver %s: link %s (ifindex %d) on uplink %d", sl.Name, v.Name, v.Ifindex, v.Uplink)
			}
			mac, err := macOf(v.Ifindex)
			if err != nil {
				return nil, nil, fmt.Errorf("sliver %s: %w", sl.Name, err)
			}
			rec.Vif[v.Uplink] = uint32(v.Ifindex)
			pv := vifRecord{Slot: sl.Slot, Uplink: uint8(v.Uplink)}
			copy(pv.Mac[:], mac)
			s.vifs[uint32(v.Ifindex)] = pv
			s.fanout[fanoutKey{Uplink: uint32(v.Uplink), Index: fan[v.Uplink]}] = uint32(v.Ifindex)
			fan[v.Uplink]++
			attach[v.Name] = v.Ifindex
		}
		s.slivers[sl.Slot] = rec
	}
	for _, u := range p.Uplinks {
		if u.Index < 0 || u.Index >= limits.MaxUplinks || !u.Addr.Is4() || len(u.MAC) != 6 {
			return nil, nil, fmt.Errorf("uplink %s: index %d, address %s, MAC %s: not an IPv4 uplink 0..%d", u.Name, u.Index, u.Addr, u.MAC, limits.MaxUplinks-1)
		}
		rec := uplinkRecord{Ifindex: uint32(u.Ifindex), Addr: datapath.IPKey(u.Addr), Index: uint8(u.Index), Vifs: fan[u.Index]}
		copy(rec.Mac[:], u.MAC)
		s.uplinks[uint32(u.Ifindex)] = rec
		s.index[uint32(u.Index)] = rec
		s.addrs[rec.Addr] = uint32(u.Index)
	}
	if len(p.Slivers) > 0 {
		s.limits[0] = limitsFor(len(p.Slivers), f.capacity("portspace_frags"), f.capacity("portspace_echo_ids"))
	}
	return s, attach, nil
}

func (f *Feature) capacity(name string) int {
	if c := f.k.Capacity(name); c > 0 {
		return c
	}
	return 1
}

// Sync implements feature.Feature: the reconciled maps are made to hold
// exactly p, writing only what differs from what they hold; the sliver
// program is put on every sliver link of p and taken off every other.
// New entries are written before the ports point at them, and the ports
// are let go before what they pointed at is removed.
func (f *Feature) Sync(fp feature.Plan) error {
	p, ok := fp.(Plan)
	if !ok {
		return fmt.Errorf("portspace: plan of type %T", fp)
	}
	if f.k == nil {
		// An agent on a fake datapath (tests): nothing to write to.
		if len(p.Slivers) == 0 {
			return nil
		}
		return errors.New("portspace: no datapath loaded")
	}
	if f.links == nil {
		return errors.New("portspace: its programs are not loaded (Load)")
	}
	// The namespaces first: the host's end of a sliver's link takes the
	// shared MAC there, which the maps record.
	// A sliver whose namespace cannot be set up (not there yet, gone)
	// is logged and tried again next pass; it must not keep the other
	// slivers' ports from being steered, and its frames are confined by
	// the datapath whatever its namespace says.
	if f.confiner != nil {
		if err := f.confiner.Apply(p); err != nil {
			f.rl.Warn("confine", "a sliver's namespace is not confined to its lease yet; tried again every pass", "err", err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sync(p)
}

func (f *Feature) sync(p Plan) error {
	want, attach, err := f.want(p)
	if err != nil {
		return fmt.Errorf("portspace: %w", err)
	}
	if want.cgroups, err = f.cgroupIDs(p); err != nil {
		return fmt.Errorf("portspace: %w", err)
	}
	// portspace_ports is made from the leases alone: when they are those the
	// map was last made to hold, it holds them, and nothing of its
	// 262,144 slots is looked at. Otherwise the whole of it is made
	// again (a few hundred µs) and compared with what it holds.
	leases := leasesOf(p)
	samePorts := f.cur != nil && f.portsKnown && slices.Equal(leases, f.portsFrom)
	var wantPorts []uint32
	if !samePorts {
		if f.scratch == nil {
			f.scratch = make([]uint32, portKeys)
		}
		if err := portsOf(leases, f.scratch); err != nil {
			return fmt.Errorf("portspace: %w", err)
		}
		wantPorts = f.scratch
	}
	if f.cur == nil {
		// An agent's first pass, or the first after a failed write:
		// what the maps hold is read, not assumed, and compared with.
		if f.cur, err = f.read(); err != nil {
			return fmt.Errorf("portspace: %w", err)
		}
	} else {
		// A slot a sliver takes anew starts with nothing counted.
		for slot := range want.slivers {
			if _, had := f.cur.slivers[slot]; !had {
				if err := f.resetSlot(slot); err != nil {
					return fmt.Errorf("portspace: %w", err)
				}
			}
		}
	}
	cur := f.cur
	m := func(name string) datapath.Table {
		mm, merr := f.table(name)
		if merr != nil && err == nil {
			err = merr
		}
		return mm
	}
	maps := struct{ uplinks, index, addrs, ports, slivers, vifs, fanout, cgroups, limits datapath.Table }{
		m(MapUplinks), m(mapUplinkIndex), m(MapAddrs), m(MapPorts), m(MapSlivers), m(MapVifs), m(MapFanout), m(MapCgroups), m(mapConfig),
	}
	if err != nil {
		return fmt.Errorf("portspace: %w", err)
	}
	steps := []func() error{
		// What the ports will point at, first.
		func() error { return datapath.PutChanged(maps.slivers, cur.slivers, want.slivers, MapSlivers) },
		func() error { return datapath.PutChanged(maps.vifs, cur.vifs, want.vifs, MapVifs) },
		func() error { return datapath.PutChanged(maps.fanout, cur.fanout, want.fanout, MapFanout) },
		func() error { return datapath.PutChanged(maps.index, cur.index, want.index, mapUplinkIndex) },
		func() error { return datapath.PutChanged(maps.uplinks, cur.uplinks, want.uplinks, MapUplinks) },
		func() error { return datapath.PutChanged(maps.addrs, cur.addrs, want.addrs, MapAddrs) },
		func() error { return datapath.PutChanged(maps.limits, cur.limits, want.limits, mapConfig) },
		func() error { return datapath.PutChanged(maps.cgroups, cur.cgroups, want.cgroups, MapCgroups) },
		func() error { return putPorts(maps.ports, cur.ports, wantPorts) },
		func() error { return removePorts(maps.ports, cur.ports, wantPorts) },
		func() error { return datapath.RemoveGone(maps.cgroups, cur.cgroups, want.cgroups, false, MapCgroups) },
		func() error { return datapath.RemoveGone(maps.addrs, cur.addrs, want.addrs, false, MapAddrs) },
		func() error { return datapath.RemoveGone(maps.uplinks, cur.uplinks, want.uplinks, false, MapUplinks) },
		func() error { return datapath.RemoveGone(maps.index, cur.index, want.index, true, mapUplinkIndex) },
		func() error { return datapath.RemoveGone(maps.fanout, cur.fanout, want.fanout, false, MapFanout) },
		func() error { return datapath.RemoveGone(maps.vifs, cur.vifs, want.vifs, false, MapVifs) },
		func() error { return datapath.RemoveGone(maps.slivers, cur.slivers, want.slivers, true, MapSlivers) },
		func() error { return datapath.RemoveGone(maps.limits, cur.limits, want.limits, true, mapConfig) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			// What the maps hold is no longer known for sure: read it
			// again on the next pass, and compare every port with it.
			f.cur, f.portsKnown, f.portsFrom = nil, false, nil
			return fmt.Errorf("portspace: %w", err)
		}
	}
	if !samePorts {
		f.portsKnown, f.portsFrom = true, leases
	}
	f.names = map[uint32]string{}
	for _, sl := range p.Slivers {
		f.names[sl.Slot] = sl.Name
	}
	return f.attach(p, attach)
}

// putPorts writes every port of want (nil: unchanged, nothing to do)
// whose slot cur does not have, and records it in cur.
func putPorts(m datapath.Table, cur, want []uint32) error {
	for key, slot := range want {
		if slot == 0 || cur[key] == slot {
			continue
		}
		if err := m.Put(uint32(key), slot); err != nil {
			return fmt.Errorf("write portspace_ports: %w", err)
		}
		cur[key] = slot
	}
	return nil
}

// removePorts zeroes every port cur has that want (nil: unchanged) has
// not: the port is the host's again.
func removePorts(m datapath.Table, cur, want []uint32) error {
	if want == nil {
		return nil
	}
	for key, slot := range cur {
		if slot == 0 || want[key] != 0 {
			continue
		}
		if err := m.Put(uint32(key), uint32(0)); err != nil {
			return fmt.Errorf("remove from portspace_ports: %w", err)
		}
		cur[key] = 0
	}
	return nil
}

// table is the reconciled map name as Sync writes it: the kernel's, or
// what a test put in its place (f.tables).
func (f *Feature) table(name string) (datapath.Table, error) {
	if f.tables != nil {
		return f.tables(name)
	}
	return f.k.Map(name)
}

// attach puts the programs where p needs them and takes them off where it
// no longer does.
func (f *Feature) attach(p Plan, want map[string]int) error {
	var errs []error
	for name, ifindex := range want {
		errs = append(errs, f.links.AttachSliver(name, ifindex))
	}
	have, err := f.links.SliverLinks()
	if err != nil {
		errs = append(errs, err)
	}
	for _, name := range have {
		if _, ok := want[name]; !ok {
			errs = append(errs, f.links.DetachSliver(name))
		}
	}
	if len(p.Slivers) > 0 {
		errs = append(errs, f.links.AttachLoopback())
		if f.cgroupDir != "" {
			errs = append(errs, f.links.AttachSliverCgroups(f.cgroupDir))
		}
	} else {
		errs = append(errs, f.links.DetachLoopback())
		if f.cgroupDir != "" {
			errs = append(errs, f.links.DetachSliverCgroups())
		}
	}
	return errors.Join(errs...)
}

// cgroupIDs maps each sliver's cgroup to its slot; a cgroup not made yet
// is taken in on a later pass.
func (f *Feature) cgroupIDs(p Plan) (map[uint64]uint32, error) {
	out := map[uint64]uint32{}
	if f.cgroupDir == "" {
		return out, nil
	}
	for _, sl := range p.Slivers {
		id, err := cgroupID(filepath.Join(f.cgroupDir, sl.Name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out[id] = sl.Slot
	}
	return out, nil
}

// resetSlot zeroes a slot's counters and shares.
func (f *Feature) resetSlot(slot uint32) error {
	stats, err := f.table("portspace_stats")
	if err != nil {
		return err
	}
	shares, err := f.table("portspace_shares")
	if err != nil {
		return err
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("possible cpus: %w", err)
	}
	if err := stats.Put(slot, make([]countersRecord, cpus)); err != nil {
		return fmt.Errorf("reset counters of slot %d: %w", slot, err)
	}
	if err := shares.Put(slot, shareRecord{}); err != nil {
		return fmt.Errorf("reset shares of slot %d: %w", slot, err)
	}
	return nil
}

// read takes what the maps hold (when the feature starts: an agent
// restart finds the maps its predecessor wrote; and after a failed write).
func (f *Feature) read() (*state, error) {
	s := newState(true)
	for _, r := range []func() error{
		func() error { return datapath.ReadMap(f.k, MapUplinks, s.uplinks) },
		func() error { return datapath.ReadMap(f.k, mapUplinkIndex, s.index) },
		func() error { return datapath.ReadMap(f.k, MapAddrs, s.addrs) },
		func() error { return f.readPorts(s.ports) },
		func() error { return datapath.ReadMap(f.k, MapSlivers, s.slivers) },
		func() error { return datapath.ReadMap(f.k, MapVifs, s.vifs) },
		func() error { return datapath.ReadMap(f.k, MapFanout, s.fanout) },
		func() error { return datapath.ReadMap(f.k, MapCgroups, s.cgroups) },
		func() error { return datapath.ReadMap(f.k, mapConfig, s.limits) },
	} {
		if err := r(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// portsBatch is how many portspace_ports slots one read takes: 64 KiB of keys
// and as much of values, 4 system calls for the whole map (one lookup
// per slot took half a second).
const portsBatch = 16384

// readPorts reads portspace_ports into into (portKeys long), in batches.
func (f *Feature) readPorts(into []uint32) error {
	m, err := f.k.Map(MapPorts)
	if err != nil {
		return err
	}
	if int(m.MaxEntries()) != len(into) {
		return fmt.Errorf("read %s: %d entries, want %d", MapPorts, m.MaxEntries(), len(into))
	}
	keys, vals := make([]uint32, portsBatch), make([]uint32, portsBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n; i++ {
			into[keys[i]] = vals[i]
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil // the end of the map
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", MapPorts, err)
		}
	}
}

// Stats reads each synced sliver's counters, summed over CPUs, with its
// drops by reason (named as the node's drop metrics name them).
func (f *Feature) Stats() ([]intent.SliverStats, error) {
	f.mu.Lock()
	names := make(map[uint32]string, len(f.names))
	for slot, n := range f.names {
		names[slot] = n
	}
	f.mu.Unlock()
	m, err := f.k.Map("portspace_stats")
	if err != nil {
		return nil, err
	}
	slots := make([]uint32, 0, len(names))
	for slot := range names {
		slots = append(slots, slot)
	}
	sort.Slice(slots, func(i, j int) bool { return slots[i] < slots[j] })
	out := make([]intent.SliverStats, 0, len(slots))
	for _, slot := range slots {
		var per []countersRecord
		if err := m.Lookup(slot, &per); err != nil {
			return nil, fmt.Errorf("read counters of %s: %w", names[slot], err)
		}
		st := intent.SliverStats{Name: names[slot], Drops: map[string]uint64{}}
		for _, c := range per {
			st.PacketsIn += c.PacketsIn
			st.PacketsOut += c.PacketsOut
			st.BytesIn += c.BytesIn
			st.BytesOut += c.BytesOut
			for i, n := range c.Drops {
				if n == 0 {
					continue
				}
				name := dropName(f.k, i)
				if name == "" {
					name = fmt.Sprintf("ps_drop_%d", i)
				}
				st.Drops[name] += n
			}
		}
		out = append(out, st)
	}
	return out, nil
}
