package datapath

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/arpengine"
	"github.com/onehop/onehop/internal/bpfobj"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
)

// Kernel is the datapath in the running kernel: the loaded programs, their
// shared maps, and the tcx links that attach them.
type Kernel struct {
	pinDir string // "" when nothing is pinned (tests)
	vif    vifObjects
	uplink uplinkObjects
	links  *bpfobj.Links
	maps   map[string]*ebpf.Map // every map of both programs, by its name in the C
	// closeWith are objects loaded on these maps (port space's programs),
	// closed with them.
	closeWith []io.Closer
	// barrier and barrierInner: waitForPrograms updates one in the other.
	barrier, barrierInner *ebpf.Map
	dropName              []string
	fwdName               []string
	// dropCounted is dropName without the reason that drops nothing.
	dropCounted []string
	// The trace instance (trace.go), loaded on the first trace.
	traceOnce sync.Once
	tracer    *tracer
	traceErr  error
	// traceFeatures are features' trace programs (TraceWith).
	traceMu       sync.Mutex
	traceFeatures map[string]TraceFunc
}

// Options size what the operator may size.
type Options struct {
	// MappingTableSize is the mapping table's fixed number of entries
	// (remote VMs this host can address at once); 0 keeps the default.
	MappingTableSize int
	// Sizes sizes the tables an operator may size (Sizes.Mappings is
	// MappingTableSize; give one or the other).
	Sizes Sizes
	// testHooks loads the objects built with ONEHOP_TEST_HOOKS (tests only).
	testHooks bool
}

// MinMappingTableSize keeps the LRU's per-CPU lists meaningful.
const MinMappingTableSize = 64

// Open loads the programs. With pinDir set, maps are pinned under
// pinDir/maps and reused if already there, and links are pinned under
// pinDir/links, so traffic keeps flowing across an agent restart and a new
// agent takes over the same maps.
func Open(pinDir string, o Options) (*Kernel, error) {
	vifSpec, uplinkSpec := loadVif, loadUplink
	if o.testHooks {
		vifSpec, uplinkSpec = loadVifTest, loadUplinkTest
	}
	spec, err := vifSpec()
	if err != nil {
		return nil, err
	}
	sizes := o.Sizes
	if o.MappingTableSize != 0 {
		if sizes.Mappings != 0 && sizes.Mappings != o.MappingTableSize {
			return nil, fmt.Errorf("mapping table size given twice: %d and %d", o.MappingTableSize, sizes.Mappings)
		}
		sizes.Mappings = o.MappingTableSize
	}
	if err := sizes.apply(spec); err != nil {
		return nil, err
	}
	// The cloud's address plan, read from the store before the agent
	// opens the datapath (the uplink program gets it through LoadOn).
	if err := bpfobj.SetPlan(spec, addrplan.Current()); err != nil {
		return nil, err
	}
	k := &Kernel{pinDir: pinDir, links: bpfobj.NewLinks(pinPath(pinDir, "links"))}
	if k.dropName, err = bpfobj.EnumNames(spec, "drop_reason", "DROP_"); err != nil {
		return nil, err
	}
	if k.fwdName, err = bpfobj.EnumNames(spec, "forward_path", "FWD_"); err != nil {
		return nil, err
	}
	k.dropCounted = slices.Clone(k.dropName)
	if i := slices.Index(k.dropCounted, "none"); i >= 0 {
		k.dropCounted[i] = ""
	}

	opts := &ebpf.CollectionOptions{}
	if pinDir == "" {
		for _, m := range spec.Maps {
			m.Pinning = ebpf.PinNone
		}
	} else {
		opts.Maps.PinPath = filepath.Join(pinDir, "maps")
		if err := os.MkdirAll(opts.Maps.PinPath, 0o700); err != nil {
			return nil, fmt.Errorf("pin dir: %w", err)
		}
		if err := os.MkdirAll(filepath.Join(pinDir, "links"), 0o700); err != nil {
			return nil, fmt.Errorf("pin dir: %w", err)
		}
	}
	// Pinned maps are reused as they are, so traffic goes on across a
	// restart; one that no longer fits (resized by a flag, or from a build
	// with another layout) is replaced alone, and its entries carried over.
	var stale []stalePin
	if pinDir != "" {
		if stale, err = setAsideStalePins(spec, opts.Maps.PinPath); err != nil {
			return nil, err
		}
	}
	if err := spec.LoadAndAssign(&k.vif, opts); err != nil {
		restorePins(stale)
		return nil, fmt.Errorf("load vif program: %w", err)
	}
	moveEntries(stale, bpfobj.MapsByName(&k.vif.vifMaps))

	// Every pinned map of the vif program is shared with the uplink program
	// (and any other loaded on them, Maps) by name: a feature's new map
	// needs no line here.
	shared := bpfobj.MapsByName(&k.vif.vifMaps)
	uspec, err := uplinkSpec()
	if err == nil {
		err = bpfobj.LoadOn(uspec, &k.uplink, shared, "uplink", "vif")
	}
	if err != nil {
		k.Close()
		return nil, err
	}
	k.maps = shared
	for name, m := range bpfobj.MapsByName(&k.uplink.uplinkMaps) {
		if _, ok := k.maps[name]; !ok {
			k.maps[name] = m
		}
	}
	if k.barrier, k.barrierInner, err = newBarrier(); err != nil {
		k.Close()
		return nil, err
	}
	return k, nil
}

// VifProgram and UplinkProgram are exposed for BPF_PROG_RUN tests.
func (k *Kernel) VifProgram() *ebpf.Program { return k.vif.VifIngress }

// MacvtapGuard is the program on a macvtap guest's tcx ingress: it passes
// only frames the datapath delivered (GuestMark).
func (k *Kernel) MacvtapGuard() *ebpf.Program { return k.vif.VifMacvtapGuard }

// UplinkProgram is the program on the uplink's tcx ingress.
func (k *Kernel) UplinkProgram() *ebpf.Program { return k.uplink.UplinkIngress }

// PinDir is where the maps and links are pinned, "" when nothing is.
func (k *Kernel) PinDir() string { return k.pinDir }

// Maps are the programs' maps by their names in the C, for another object
// to load on (bpfobj.LoadOn): port space's programs use the router's maps.
func (k *Kernel) Maps() map[string]*ebpf.Map { return maps.Clone(k.maps) }

// CloseWith has c closed when k is: an object loaded on k's maps lives no
// longer than they do in this process.
func (k *Kernel) CloseWith(c io.Closer) { k.closeWith = append(k.closeWith, c) }

// Close releases this process's handles. Pinned maps and links stay.
func (k *Kernel) Close() error {
	for _, c := range k.closeWith {
		c.Close()
	}
	k.links.Close()
	k.uplink.Close()
	if k.barrier != nil {
		k.barrier.Close()
		k.barrierInner.Close()
	}
	return k.vif.Close()
}

// pinPath is pinDir/sub, or "" when nothing is pinned.
func pinPath(pinDir, sub string) string {
	if pinDir == "" {
		return ""
	}
	return filepath.Join(pinDir, sub)
}

// attach makes sure prog is on ifname's tcx ingress. A pinned link for the
// same ifindex is taken over and given the freshly loaded program; a pinned
// link for an interface that was recreated (new ifindex) is replaced.
func (k *Kernel) attach(ifname string, ifindex int, prog *ebpf.Program) error {
	return k.links.TCX(ifname, ifname, ifindex, prog, ebpf.AttachTCXIngress)
}

// isVifLink reports whether a link (by its name in k.links) is a VM's vif,
// the only links Apply attaches and removes: every such name starts with
// intent.VifPrefix (vifLinkName).
func isVifLink(name string) bool { return strings.HasPrefix(name, intent.VifPrefix) }

// vifLinkName is the name of the link (and its pin) that holds the vif
// program on interface ifname: the interface's own name when it is a
// default vif name, else the prefix, "@" and the name ("vif-@tap0"), so a
// guest's interface of any name is known for a vif link after a restart
// too, and is never taken for another feature's.
func vifLinkName(ifname string) string {
	if isVifLink(ifname) {
		return ifname
	}
	return intent.VifPrefix + "@" + ifname
}

// guardLinkName is the name of the link that holds the guard on a macvtap
// guest's ingress: its vif link's name and ":guard", which no interface
// name can contain (Linux refuses ':'), so it is no other vif's.
func guardLinkName(ifname string) string { return vifLinkName(ifname) + ":guard" }

// attachVif puts the vif program on a guest's interface where the guest's
// frames arrive: tcx ingress on a veth or a tap; on a macvtap its egress
// (what the guest writes is sent by the device), with the guard on its
// ingress first, so the guest hears nothing the datapath did not deliver
// from the moment its frames are judged. want collects the links' names.
func (k *Kernel) attachVif(ifname string, ifindex int, kind VifKind, want map[string]bool) error {
	if kind != VifMacvtap {
		want[vifLinkName(ifname)] = true
		return k.links.TCX(vifLinkName(ifname), ifname, ifindex, k.vif.VifIngress, ebpf.AttachTCXIngress)
	}
	want[guardLinkName(ifname)] = true
	if err := k.links.TCX(guardLinkName(ifname), ifname, ifindex, k.vif.VifMacvtapGuard, ebpf.AttachTCXIngress); err != nil {
		return err
	}
	want[vifLinkName(ifname)] = true
	return k.links.TCX(vifLinkName(ifname), ifname, ifindex, k.vif.VifIngress, ebpf.AttachTCXEgress)
}

// AttachUplink puts the uplink program on the node's uplink.
func (k *Kernel) AttachUplink(ifname string, ifindex int) error {
	return k.attach(ifname, ifindex, k.uplink.UplinkIngress)
}

// Apply makes the maps hold exactly e and the vif program sit on exactly the
// vifs in e.Attach (plus the uplink). Nothing is written when a map cannot
// hold its part of e (a *feature.OverflowError says which and by how much):
// the maps keep what they held rather than a random subset. Map entries are
// written before a vif is attached, so a newly attached vif never sees an
// empty table; a changed rule set is switched to at once, never piecemeal
// (policy_update.go).
func (k *Kernel) Apply(e Entries, uplinkName string) error {
	if err := feature.CheckFit("router", e.Sizes(), k.Capacity); err != nil {
		return err
	}
	steps, err := k.plan(e)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range steps {
		if err := s.do(); err != nil {
			errs = append(errs, err)
			break
		}
	}
	want := make(map[string]bool, len(e.Attach))
	for ifname, ifindex := range e.Attach {
		errs = append(errs, k.attachVif(ifname, ifindex, VifKind(e.Vifs[uint32(ifindex)].Kind), want))
	}
	// Only the router's own links (vifs) are Apply's to remove: the
	// uplinks and the links other features attach are theirs.
	for _, name := range k.links.Held() {
		if !want[name] && name != uplinkName && isVifLink(name) {
			k.links.Detach(name)
		}
	}
	if k.pinDir != "" {
		// Pins of links this process never opened (a vif removed while no
		// agent ran) are stale too.
		entries, _ := os.ReadDir(filepath.Join(k.pinDir, "links"))
		for _, de := range entries {
			if !want[de.Name()] && de.Name() != uplinkName && isVifLink(de.Name()) {
				os.Remove(filepath.Join(k.pinDir, "links", de.Name()))
			}
		}
	}
	return errors.Join(errs...)
}

// plan lists the map writes that take the maps from what they hold to e, in
// an order that keeps every packet judged by exactly one rule set.
func (k *Kernel) plan(e Entries) ([]step, error) {
	var cur NodeConfig
	if err := k.vif.Config.Lookup(uint32(0), &cur); err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	sets, err := k.readPolicy()
	if err != nil {
		return nil, err
	}
	want := policySet{vis: e.Visibility, fw: e.Firewalls, rules: e.FirewallRules}
	inForce := uint8(cur.PolicyEpoch & 1)
	switching := !sets[inForce].equal(want)
	cfg := e.Config
	cfg.PolicyEpoch = cur.PolicyEpoch
	cfg.Features = cur.Features // the agent's to set (SetFeatures)
	if switching {
		// Admitted flows pass on one lookup; a new epoch makes each be
		// checked again against the new rules the next time it is seen.
		cfg.PolicyEpoch++
	}
	next := uint8(cfg.PolicyEpoch & 1)

	// The endpoints first, with every firewall flag either rule set needs.
	eps, err := withFlags(k.vif.Endpoints, e.Endpoints, func(v *Endpoint) *uint8 { return &v.Firewall })
	if err != nil {
		return nil, err
	}
	vifs, err := withFlags(k.vif.Vifs, e.Vifs, func(v *VifInfo) *uint8 { return &v.Firewall })
	if err != nil {
		return nil, err
	}
	steps := []step{
		{"endpoints", func() error { return syncMap(k.vif.Endpoints, eps, "endpoints", nil) }},
		{"vifs", func() error { return syncMap(k.vif.Vifs, vifs, "vifs", nil) }},
	}
	// Whatever the generation not in force holds is left over from an
	// interrupted switch: no program reads it.
	spare := inForce ^ 1
	if !sets[spare].empty() {
		steps = append(steps, k.deleteSet(sets[spare], spare)...)
	}
	if switching {
		steps = append(steps, k.writeSet(want, next)...)
	}
	if cfg != cur {
		steps = append(steps, put(k.vif.Config, "write config", uint32(0), cfg))
	}
	if switching {
		steps = append(steps, step{"wait for programs under the old rules", k.waitForPrograms})
		steps = append(steps, k.deleteSet(sets[inForce], inForce)...)
	}
	// Only the flags the rule set in force needs.
	steps = append(steps,
		step{"endpoint flags", func() error { return syncMap(k.vif.Endpoints, e.Endpoints, "endpoints", nil) }},
		step{"vif flags", func() error { return syncMap(k.vif.Vifs, e.Vifs, "vifs", nil) }},
		// Members before the counts that cover them.
		step{"scope members", func() error { return syncMap(k.vif.ScopeMembers, e.Members, "scope members", nil) }},
		step{"scopes", func() error { return syncMap(k.vif.Scopes, e.Scopes, "scopes", nil) }},
		put(k.vif.ShareConfig, "write share limits", uint32(0), SharesFor(len(e.Endpoints), k.MappingCapacity(), int(k.vif.Conntrack.MaxEntries()))),
		step{"forget shares", func() error { return k.forgetShares(e.Endpoints) }},
		step{"farms", func() error { return syncMap(k.vif.Farms, e.Farms, "farms", nil) }},
		step{"hosts", func() error { return k.syncHosts(e.Hosts) }},
	)
	return steps, nil
}

// The features' bits in node_config.features (enum feature_bit), which
// switch their stages of the router's programs on: listed here, with the
// router's config, rather than in each feature.
const (
	// FeaturePortspace is port space's bit (internal/portspace).
	FeaturePortspace = uint32(vifFeatureBitFEATURE_PORTSPACE)
	// FeatureTap is the TAP's bit (internal/tap).
	FeatureTap = uint32(vifFeatureBitFEATURE_TAP)
	// FeatureVNATLocation lets VMs reach the VNAT location service through
	// the host (bpf/lib/vnat_service.h; the agent's relay sets it).
	FeatureVNATLocation = uint32(vifFeatureBitFEATURE_VNAT_LOCATION)
	// FeatureEgress is north-south egress's bit (internal/egress).
	FeatureEgress = uint32(vifFeatureBitFEATURE_EGRESS)
)

// SetFeatures sets the node's feature bits (node_config.features), which
// switch the features' datapath stages on; the rest of the config stays.
func (k *Kernel) SetFeatures(bits uint32) error {
	var cfg NodeConfig
	if err := k.vif.Config.Lookup(uint32(0), &cfg); err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	if cfg.Features == bits {
		return nil
	}
	cfg.Features = bits
	if err := k.vif.Config.Put(uint32(0), cfg); err != nil {
		return fmt.Errorf("write feature bits: %w", err)
	}
	return nil
}

// Features returns the node's feature bits.
func (k *Kernel) Features() (uint32, error) {
	var cfg NodeConfig
	if err := k.vif.Config.Lookup(uint32(0), &cfg); err != nil {
		return 0, fmt.Errorf("read config: %w", err)
	}
	return cfg.Features, nil
}

// generational maps hold two rule sets while one replaces the other: each
// set gets half.
var generational = map[string]bool{"visibility": true, "firewalls": true, "firewall_rules": true}

// Capacity is how many entries of one plan the named map takes: its size,
// or half of it for a map holding two rule generations; -1 for a map the
// programs do not have.
func (k *Kernel) Capacity(name string) int {
	m, ok := k.maps[name]
	if !ok {
		return -1
	}
	if generational[name] {
		return int(m.MaxEntries()) / 2
	}
	return int(m.MaxEntries())
}

// Map returns one of the programs' maps by its name in the C, for a
// feature's sync to write.
func (k *Kernel) Map(name string) (*ebpf.Map, error) {
	m, ok := k.maps[name]
	if !ok {
		return nil, fmt.Errorf("no map named %s in the datapath", name)
	}
	return m, nil
}

// forgetShares removes the share of every VM that is no longer local: the
// datapath creates entries, the VM's stay on the host bounds their life.
func (k *Kernel) forgetShares(local map[uint32]Endpoint) error {
	var key uint32
	var val VMShare
	var gone []uint32
	it := k.vif.VmShares.Iterate()
	for it.Next(&key, &val) {
		if _, ok := local[key]; !ok {
			gone = append(gone, key)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read vm shares: %w", err)
	}
	for _, key := range gone {
		if err := k.vif.VmShares.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("forget share of %s: %w", KeyIP(key), err)
		}
	}
	return nil
}

// syncMap writes want into m and deletes every key of m not in want; it
// sets *changed (when given) if it wrote or deleted anything.
func syncMap[K, V comparable](m *ebpf.Map, want map[K]V, what string, changed *bool) error {
	var stale []K
	var key K
	var val V
	it := m.Iterate()
	for it.Next(&key, &val) {
		if _, ok := want[key]; !ok {
			stale = append(stale, key)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read %s: %w", what, err)
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete from %s: %w", what, err)
		}
	}
	wrote := len(stale) > 0
	for k, v := range want {
		var cur V
		if err := m.Lookup(k, &cur); err == nil && cur == v {
			continue
		}
		if err := m.Put(k, v); err != nil {
			return fmt.Errorf("write %s: %w", what, err)
		}
		wrote = true
	}
	if changed != nil && wrote {
		*changed = true
	}
	return nil
}

// Counters are the datapath's packet counters, summed over CPUs.
type Counters struct {
	Drops    map[string]uint64
	Forwards map[string]uint64
	// Refused counts, per local VM address and share kind (flows, asks,
	// punts), what the VM was refused for being over its share.
	Refused map[netip.Addr]map[string]uint64
}

// Counters reads the per-CPU counter maps.
func (k *Kernel) Counters() (Counters, error) {
	c := Counters{Refused: map[netip.Addr]map[string]uint64{}}
	var err error
	// DROP_NONE counts nothing.
	if c.Drops, err = bpfobj.Counters(k.vif.Drops, k.dropCounted); err != nil {
		return c, err
	}
	if c.Forwards, err = bpfobj.Counters(k.vif.Forwards, k.fwdName); err != nil {
		return c, err
	}
	var key uint32
	var val VMShare
	it := k.vif.VmShares.Iterate()
	for it.Next(&key, &val) {
		for kind, n := range val.Refused {
			if n > 0 && kind < len(shareKindNames) {
				if c.Refused[KeyIP(key)] == nil {
					c.Refused[KeyIP(key)] = map[string]uint64{}
				}
				c.Refused[KeyIP(key)][shareKindNames[kind]] = n
			}
		}
	}
	if err := it.Err(); err != nil {
		return c, fmt.Errorf("read vm shares: %w", err)
	}
	return c, nil
}

// DropReason names a drop reason code as the metrics do.
func (k *Kernel) DropReason(code uint32) string {
	if int(code) < len(k.dropName) && k.dropName[code] != "" {
		return k.dropName[code]
	}
	return fmt.Sprintf("reason_%d", code)
}

// DropEvents opens a reader on the drop ring buffer.
func (k *Kernel) DropEvents() (*ringbuf.Reader, error) {
	return ringbuf.NewReader(k.vif.DropEvents)
}

// SlowPath opens a reader on the frames the datapath hands the agent.
func (k *Kernel) SlowPath() (*ringbuf.Reader, error) {
	return ringbuf.NewReader(k.vif.Slowpath)
}

// Mappings lists the mapping table. An LRU table can change under the walk;
// an entry evicted meanwhile is simply missing.
//
// The ARP engine reads it whole every second, so it is read in batches of
// mappingBatch entries a system call (a 200,000-entry table: ~50 calls, not
// 400,000), falling back to one entry at a time where the kernel has no
// batch lookup.
func (k *Kernel) Mappings() ([]arpengine.Entry, error) {
	keys, vals, err := k.readMappings()
	// One slab for every host MAC: a large table costs two allocations
	// a read, not one per entry.
	out := make([]arpengine.Entry, len(keys))
	macs := make([]byte, 6*len(keys))
	for i, key := range keys {
		v := &vals[i]
		out[i] = arpengine.Entry{IP: KeyIP(key), Confirmed: time.Duration(v.ConfirmedNs), Used: time.Duration(v.UsedNs)}
		if v.HostMac != [6]byte{} {
			mac := macs[6*i : 6*i+6 : 6*i+6]
			copy(mac, v.HostMac[:])
			out[i].HostMAC = mac
		}
	}
	return out, err
}

func (k *Kernel) readMappings() ([]uint32, []Mapping, error) {
	keys := make([]uint32, 0, mappingBatch)
	vals := make([]Mapping, 0, mappingBatch)
	bk := make([]uint32, mappingBatch)
	bv := make([]Mapping, mappingBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := k.vif.Mappings.BatchLookup(&cursor, bk, bv, nil)
		keys, vals = append(keys, bk[:n]...), append(vals, bv[:n]...)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return keys, vals, nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) && len(keys) == 0 {
			break
		}
		if err != nil {
			return keys, vals, fmt.Errorf("read mapping table: %w", err)
		}
	}
	var key uint32
	var val Mapping
	it := k.vif.Mappings.Iterate()
	for it.Next(&key, &val) {
		keys, vals = append(keys, key), append(vals, val)
	}
	if err := it.Err(); err != nil {
		return keys, vals, fmt.Errorf("read mapping table: %w", err)
	}
	return keys, vals, nil
}

// mappingBatch is how many mapping-table entries one system call reads.
const mappingBatch = 4096

// Mapping returns the host holding ip, if the table has one.
func (k *Kernel) Mapping(ip netip.Addr) (net.HardwareAddr, bool) {
	var val Mapping
	if err := k.vif.Mappings.Lookup(IPKey(ip), &val); err != nil || val.HostMac == [6]byte{} {
		return nil, false
	}
	return net.HardwareAddr(append([]byte(nil), val.HostMac[:]...)), true
}

// ForgetMapping removes ip's entry; a missing entry is no error.
func (k *Kernel) ForgetMapping(ip netip.Addr) error {
	if err := k.vif.Mappings.Delete(IPKey(ip)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("forget mapping %s: %w", ip, err)
	}
	return nil
}

// MappingCapacity is the mapping table's fixed size.
func (k *Kernel) MappingCapacity() int { return int(k.vif.Mappings.MaxEntries()) }

// MapNames lists every map the two programs define, by its name in the C
// (what a feature declares in feature.Feature.Maps).
func MapNames() ([]string, error) {
	seen := map[string]bool{}
	for _, load := range []func() (*ebpf.CollectionSpec, error){loadVif, loadUplink} {
		spec, err := load()
		if err != nil {
			return nil, err
		}
		for name, m := range spec.Maps {
			if m.Pinning != ebpf.PinNone {
				seen[name] = true
			}
		}
	}
	names := make([]string, 0, len(seen))
	for name := range seen {
		names = append(names, name)
	}
	sort.Strings(names)
	return names, nil
}

// OpenTestObjects loads the objects built with ONEHOP_TEST_HOOKS (every
// redirect logged in each program's redirect_log), unpinned: for other
// packages' BPF_PROG_RUN tests (port space's, TAP's). The agent never
// calls it.
func OpenTestObjects() (*Kernel, error) { return Open("", Options{testHooks: true}) }

// MapSpecs is every map as compiled (the vif program defines them all), by
// its name in the C: for a feature's test to hold its own records to them.
func MapSpecs() (map[string]*ebpf.MapSpec, error) {
	spec, err := loadVif()
	if err != nil {
		return nil, err
	}
	return spec.Maps, nil
}

// MapSizes is every map's size as compiled, by its name in the C.
func MapSizes() (map[string]int, error) {
	specs, err := MapSpecs()
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for name, m := range specs {
		out[name] = int(m.MaxEntries)
	}
	return out, nil
}
