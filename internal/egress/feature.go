package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ratelog"
)

// Egress's map records (bpf/lib/egress_maps.h), generated from the C.
type (
	addrRecord     = egressEgressAddr
	ownerRecord    = egressEgressOwner
	vmRecord       = egressEgressVm
	toKey          = egressEgressToKey
	mapRecord      = egressEgressMap
	countersRecord = egressEgressCounters
	publishKey     = egressEgressPublishKey
	publishRecord  = egressEgressPublish
)

// Kinds of egress_addrs and egress_ports entries (enum egress_addr_kind,
// egress_owner_kind).
const (
	addrUplink   = uint32(egressEgressAddrKindEGRESS_ADDR_UPLINK)
	addrFloating = uint32(egressEgressAddrKindEGRESS_ADDR_FLOATING)
	ownerSlice   = uint32(egressEgressOwnerKindEGRESS_OWNER_SLICE)
	ownerPub     = uint32(egressEgressOwnerKindEGRESS_OWNER_PUBLISHED)
	protoRows    = 3 // TCP, UDP, ICMP echo: the rows of egress_state
	maxSlotsCap  = 16384
)

// Feature is egress as the agent runs it: Compile (compile.go), Sync
// writing the plan into the router's maps, Stats reading each VM's
// counters and slice use.
type Feature struct {
	k    *datapath.Kernel
	node string
	log  *slog.Logger
	rl   *ratelog.Logger

	mu       sync.Mutex
	slotOf   map[string]uint32 // VM name -> slot, kept from pass to pass
	cur      map[string]VM     // what the maps hold, by VM name
	host     netip.Addr        // the address egress_addrs holds
	refused  map[string]uint64 // refusals last seen per VM, for the log
	lastPlan Plan
	announce func(netip.Addr) // a floating address arrived (floating.go)
}

// New is the feature on the loaded datapath k (nil: an agent on a fake
// datapath, where only an empty plan syncs).
func New(k *datapath.Kernel) *Feature {
	return &Feature{k: k, slotOf: map[string]uint32{}, cur: map[string]VM{}, refused: map[string]uint64{}}
}

// WithAgent gives the feature the agent's log and node name.
func (f *Feature) WithAgent(node string, log *slog.Logger) *Feature {
	f.node, f.log = node, log
	f.rl = ratelog.New(log, 1, time.Minute, time.Now)
	return f
}

// Name implements feature.Feature.
func (f *Feature) Name() string { return "egress" }

// Bit implements feature.Feature: FEATURE_EGRESS in the C.
func (f *Feature) Bit() uint32 { return datapath.FeatureEgress }

// Maps implements feature.Feature: every map of bpf/lib/egress_maps.h.
func (f *Feature) Maps() []feature.Map {
	rec := func(name string) feature.Map { return feature.Map{Name: name, Owner: feature.Reconciled} }
	own := func(name, lifetime string) feature.Map {
		return feature.Map{Name: name, Owner: feature.Datapath, Lifetime: lifetime}
	}
	return []feature.Map{
		rec(MapAddrs), rec(MapPorts), rec(MapVMs), rec(MapSlots), rec(MapTo), rec(MapPublished),
		own(MapState, "one translation per protocol and port of a slice; free once its per-protocol timeout passes (docs/north-south.md)"),
		own(MapFlows, "one entry per claimed port, deleted when the port is claimed again; bounded by the slices"),
		own(MapFrags, "65,536 datagrams, at most 16 of each VM (egress_frag_places): a record steers later fragments for 2 s"),
		own(MapFragPlaces, "16 places per slot, the keys of its VM's fragment records: a new record replaces the VM's own in its place"),
		own(MapCursors, "one word per slot: where its VM's next claim starts; any value is a valid start"),
		own(MapStats, "per-CPU counters per slot, zeroed when a VM takes or leaves the slot"),
	}
}

// Compile implements feature.Feature.
func (f *Feature) Compile(n feature.Node) (feature.Plan, error) {
	return Compile(n)
}

func be32(a netip.Addr) uint32 { return datapath.IPKey(a) }

// beSlot is a slot as the LPM key's bytes hold it: network order.
func beSlot(slot uint32) uint32 {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], slot)
	return binary.NativeEndian.Uint32(b[:])
}

func toKeyOf(slot uint32, p netip.Prefix) toKey {
	return toKey{Prefixlen: 32 + uint32(p.Bits()), Slot: beSlot(slot), Addr: be32(p.Addr())}
}

// Sync implements feature.Feature: the reconciled maps are made to hold
// exactly p. What a key points at is written before the key (a slot before
// the address and ports naming it), and a VM's ports and address go before
// its slot is cleared.
func (f *Feature) Sync(fp feature.Plan) error {
	p, ok := fp.(Plan)
	if !ok {
		return fmt.Errorf("egress: plan of type %T", fp)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.k == nil {
		if p.InUse() {
			return errors.New("egress: no datapath to write to")
		}
		return nil
	}
	m, err := f.maps(MapAddrs, MapPorts, MapVMs, MapSlots, MapTo, MapStats, MapPublished)
	if err != nil {
		return err
	}
	want := map[string]VM{}
	for _, v := range p.VMs {
		want[v.Name] = v
	}
	// Gone or changed VMs first: their ports, address, prefixes, slot.
	for name, old := range f.cur {
		nv, keep := want[name]
		if keep && sameVM(old, nv) {
			continue
		}
		slot := f.slotOf[name]
		if err := f.clearVM(m, slot, old); err != nil {
			return err
		}
		if !keep {
			delete(f.slotOf, name)
			if err := clearCounters(m[MapStats], slot); err != nil {
				return err
			}
		}
		delete(f.cur, name)
	}
	if p.InUse() && p.Host != f.host {
		if f.host.IsValid() {
			if err := m[MapAddrs].Delete(be32(f.host)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("egress: forget address %s: %w", f.host, err)
			}
		}
		if err := m[MapAddrs].Put(be32(p.Host), addrRecord{Kind: addrUplink}); err != nil {
			return fmt.Errorf("egress: address %s: %w", p.Host, err)
		}
		f.host = p.Host
	}
	for _, v := range p.VMs {
		if _, have := f.cur[v.Name]; have {
			continue
		}
		slot, ok := f.slotOf[v.Name]
		if !ok {
			if slot, err = f.freeSlot(); err != nil {
				return err
			}
			if err := clearCounters(m[MapStats], slot); err != nil {
				return err
			}
			f.slotOf[v.Name] = slot
		}
		rec := vmRecord{VmAddr: be32(v.Addr), HostAddr: be32(p.Host), UplinkIfindex: uint32(v.Uplink.Ifindex), Uplink: 0, Lo: v.Slice.Lo, Hi: v.Slice.Hi}
		if v.Floating.IsValid() {
			rec.Floating = be32(v.Floating)
		}
		if slices.ContainsFunc(v.To, func(p netip.Prefix) bool { return p.Bits() == 0 }) {
			rec.ToAny = 1
		}
		if err := m[MapSlots].Put(slot, rec); err != nil {
			return fmt.Errorf("egress: vm %s slot %d: %w", v.Name, slot, err)
		}
		if err := putPublished(m, slot, v); err != nil {
			return err
		}
		// A VM with published ports only is not in egress_vms: its own
		// flows out are no_route, as without egress. One with a floating
		// address and no slice is, with no ports (putPorts).
		if v.leaves() {
			for _, pf := range v.To {
				if err := m[MapTo].Put(toKeyOf(slot, pf), uint8(1)); err != nil {
					return fmt.Errorf("egress: vm %s destination %s: %w", v.Name, pf, err)
				}
			}
			if err := putPorts(m[MapPorts], v.Slice, ownerRecord{Kind: ownerSlice, Slot: slot}); err != nil {
				return fmt.Errorf("egress: vm %s slice: %w", v.Name, err)
			}
			if err := m[MapVMs].Put(be32(v.Addr), slot); err != nil {
				return fmt.Errorf("egress: vm %s: %w", v.Name, err)
			}
		}
		if err := f.putFloating(m[MapAddrs], v, slot); err != nil {
			return err
		}
		f.cur[v.Name] = v
	}
	if !p.InUse() && f.host.IsValid() {
		if err := m[MapAddrs].Delete(be32(f.host)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("egress: forget address %s: %w", f.host, err)
		}
		f.host = netip.Addr{}
	}
	f.lastPlan = p
	return nil
}

func sameVM(a, b VM) bool {
	if a.Addr != b.Addr || a.Floating != b.Floating || a.Slice != b.Slice || a.Uplink.Ifindex != b.Uplink.Ifindex || len(a.To) != len(b.To) ||
		!slices.Equal(a.Published, b.Published) {
		return false
	}
	for i := range a.To {
		if a.To[i] != b.To[i] {
			return false
		}
	}
	return true
}

func (f *Feature) clearVM(m map[string]*ebpf.Map, slot uint32, v VM) error {
	if err := clearFloating(m[MapAddrs], v); err != nil {
		return err
	}
	if err := m[MapVMs].Delete(be32(v.Addr)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("egress: forget vm %s: %w", v.Name, err)
	}
	if v.HasSlice() {
		if err := putPorts(m[MapPorts], v.Slice, ownerRecord{}); err != nil {
			return fmt.Errorf("egress: free vm %s's slice: %w", v.Name, err)
		}
	}
	for _, pub := range v.Published {
		if err := m[MapPorts].Put(uint32(pub.PublicPort), ownerRecord{}); err != nil {
			return fmt.Errorf("egress: free vm %s's published port %d: %w", v.Name, pub.PublicPort, err)
		}
		if err := m[MapPublished].Delete(publishKeyOf(v.Addr, pub)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("egress: forget vm %s's publication %s: %w", v.Name, pub, err)
		}
	}
	for _, pf := range v.To {
		if err := m[MapTo].Delete(toKeyOf(slot, pf)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("egress: forget vm %s destination %s: %w", v.Name, pf, err)
		}
	}
	if err := m[MapSlots].Put(slot, vmRecord{}); err != nil {
		return fmt.Errorf("egress: free slot %d: %w", slot, err)
	}
	return nil
}

// putPublished writes v's published ports (slot is v's): the port owners
// that steer packets in, and the entries that find the public port for its
// answers out.
func putPublished(m map[string]*ebpf.Map, slot uint32, v VM) error {
	for _, pub := range v.Published {
		if err := m[MapPublished].Put(publishKeyOf(v.Addr, pub), publishRecord{Slot: slot, PublicPort: htons(pub.PublicPort)}); err != nil {
			return fmt.Errorf("egress: vm %s publication %s: %w", v.Name, pub, err)
		}
		own := ownerRecord{Kind: ownerPub, Slot: slot, Port: htons(pub.Port), Proto: protoNumber(pub.Proto)}
		if err := m[MapPorts].Put(uint32(pub.PublicPort), own); err != nil {
			return fmt.Errorf("egress: vm %s publication %s: %w", v.Name, pub, err)
		}
	}
	return nil
}

func publishKeyOf(a netip.Addr, pub intent.Publication) publishKey {
	return publishKey{VmAddr: be32(a), VmPort: htons(pub.Port), Proto: protoNumber(pub.Proto)}
}

func protoNumber(p string) uint8 {
	if p == "udp" {
		return unix.IPPROTO_UDP
	}
	return unix.IPPROTO_TCP
}

// htons is a port as the C's __be16 fields hold it.
func htons(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

// putPorts writes owner into every port of slice, in one batch (none
// for a VM without a slice).
func putPorts(ports *ebpf.Map, sl intent.Lease, owner ownerRecord) error {
	if sl.Lo == 0 {
		return nil
	}
	n := int(sl.Hi) - int(sl.Lo) + 1
	keys := make([]uint32, n)
	vals := make([]ownerRecord, n)
	for i := range n {
		keys[i] = uint32(sl.Uplink)*portsPerU + uint32(sl.Lo) + uint32(i)
		vals[i] = owner
	}
	if _, err := ports.BatchUpdate(keys, vals, nil); err != nil {
		for i := range keys {
			if err := ports.Put(keys[i], vals[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

func clearCounters(stats *ebpf.Map, slot uint32) error {
	zero := make([]countersRecord, ebpf.MustPossibleCPU())
	if err := stats.Put(slot, zero); err != nil {
		return fmt.Errorf("egress: zero counters of slot %d: %w", slot, err)
	}
	return nil
}

func (f *Feature) freeSlot() (uint32, error) {
	used := make(map[uint32]bool, len(f.slotOf))
	for _, s := range f.slotOf {
		used[s] = true
	}
	for s := uint32(1); s <= maxSlotsCap; s++ {
		if !used[s] {
			return s, nil
		}
	}
	return 0, fmt.Errorf("egress: all %d slots in use", maxSlotsCap)
}

func (f *Feature) maps(names ...string) (map[string]*ebpf.Map, error) {
	out := map[string]*ebpf.Map{}
	for _, n := range names {
		mp, err := f.k.Map(n)
		if err != nil {
			return nil, fmt.Errorf("egress: %w", err)
		}
		out[n] = mp
	}
	return out, nil
}

// Stats reads each egress VM's counters and how many ports of its slice
// hold a live translation, by VM name.
func (f *Feature) Stats() ([]intent.EgressStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.k == nil || len(f.cur) == 0 {
		return nil, nil
	}
	m, err := f.maps(MapStats, MapState)
	if err != nil {
		return nil, err
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
		return nil, fmt.Errorf("egress: clock: %w", err)
	}
	now := uint64(ts.Nano())
	var out []intent.EgressStats
	for _, name := range sortedNames(f.cur) {
		v, slot := f.cur[name], f.slotOf[name]
		var per []countersRecord
		if err := m[MapStats].Lookup(slot, &per); err != nil {
			return nil, fmt.Errorf("egress: counters of %s: %w", name, err)
		}
		s := intent.EgressStats{Name: name}
		if v.HasSlice() {
			s.Slice, s.Ports = fmt.Sprintf("%d-%d", v.Slice.Lo, v.Slice.Hi), int(v.Slice.Hi)-int(v.Slice.Lo)+1
		}
		if v.Floating.IsValid() {
			s.Floating = v.Floating.String()
		}
		for _, c := range per {
			s.PacketsOut += c.PacketsOut
			s.BytesOut += c.BytesOut
			s.PacketsIn += c.PacketsIn
			s.BytesIn += c.BytesIn
			s.Flows += c.Flows
			s.Refused += c.Refused
			s.NotAllowed += c.NotAllowed
		}
		live := 0
		if v.HasSlice() {
			if live, err = liveFlows(m[MapState], v, now); err != nil {
				return nil, err
			}
		}
		s.Live = live
		out = append(out, s)
		if s.Refused > f.refused[name] && f.rl != nil {
			f.rl.Warn("refused-"+name, "a VM's new connections out were refused: its egress slice is full",
				"vm", name, "slice", s.Slice, "refused", s.Refused-f.refused[name], "live", live)
		}
		f.refused[name] = s.Refused
	}
	return out, nil
}

// liveFlows counts the ports of v's slice whose translation, of any
// protocol, has not expired at now.
func liveFlows(state *ebpf.Map, v VM, now uint64) (int, error) {
	live := 0
	if !v.HasSlice() {
		return 0, nil
	}
	n := int(v.Slice.Hi) - int(v.Slice.Lo) + 1
	keys := make([]uint32, n)
	vals := make([]mapRecord, n)
	for row := range uint32(protoRows) {
		for i := range n {
			keys[i] = row*portsPerU + uint32(v.Slice.Lo) + uint32(i)
		}
		for i := range n {
			if err := state.Lookup(keys[i], &vals[i]); err != nil {
				return 0, fmt.Errorf("egress: translation of port %d: %w", keys[i]%portsPerU, err)
			}
			if vals[i].ExpiresNs > now && vals[i].VmAddr == be32(v.Addr) {
				live++
			}
		}
	}
	return live, nil
}

func sortedNames(m map[string]VM) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
