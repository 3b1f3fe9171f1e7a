package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sort"
	"strings"
	"sync"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ipam"
	"github.com/onehop/onehop/internal/policy"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/tappolicy"
)

// model is the controller's copy of the intent and of the desired keys it
// has written, kept so that a change costs what it touches and not what the
// cloud holds (docs/control-plane.md). The controller is intent's only
// writer: every Put or Delete it makes goes through tracked, which applies
// it here and writes the desired keys it changes. It is loaded from the
// store on first use and again by every full compile (CompileOnce), which
// also catches anything written behind the controller's back.
type model struct {
	mu     sync.Mutex
	loaded bool

	hosts   map[string]intent.Host
	farms   map[string]intent.Farm
	subnets map[string]intent.Subnet // FARM/SUBNET
	vms     map[string]intent.VM     // FARM/SUBNET/VM
	byName  map[string]string        // VM name -> FARM/SUBNET/VM (names are unique)
	onHost  map[string]map[string]bool
	slivers map[string]intent.Sliver // HOST/NAME
	taps    map[string]intent.TapPolicy

	// Allocations: farm and subnet ids (intent.AllocKey) and, per subnet,
	// its VMs' host ids (intent.VMIDsPrefix). legacyVMs says the store still holds
	// the VM ids in intent.AllocKey, as before intent.VMIDsPrefix: the next save
	// writes every subnet's key.
	allocFarms, allocSubnets map[string]uint8
	vmids                    map[string]map[string]uint8
	legacyVMs                bool

	// written is every desired and farm-state key as the store holds it;
	// vmAt and sliverAt say under which host a VM's or sliver's key was
	// written; tapRules are the TAP rules last compiled.
	written  map[string][]byte
	keysOf   map[string]map[string]bool // host -> its written desired keys
	vmAt     map[string]string
	sliverAt map[string]string
	tapRules []intent.TapRule
	tapKeys  int // desired TAP keys written, on all hosts
}

// dirty is what one change may have changed in the desired state.
type dirty struct {
	vms     map[string]bool // FARM/SUBNET/VM
	slivers map[string]bool // HOST/NAME
	hosts   map[string]bool // every key of these hosts
	farms   bool            // the farm states
	taps    bool            // the TAP rules (and so every host's TAP keys)
	tapsOn  map[string]bool // the TAP keys of these hosts
}

func newDirty() *dirty {
	return &dirty{vms: map[string]bool{}, slivers: map[string]bool{}, hosts: map[string]bool{}, tapsOn: map[string]bool{}}
}

func (m *model) reset() {
	m.hosts, m.farms, m.subnets = map[string]intent.Host{}, map[string]intent.Farm{}, map[string]intent.Subnet{}
	m.vms, m.byName, m.onHost = map[string]intent.VM{}, map[string]string{}, map[string]map[string]bool{}
	m.slivers, m.taps = map[string]intent.Sliver{}, map[string]intent.TapPolicy{}
	m.allocFarms, m.allocSubnets, m.vmids = map[string]uint8{}, map[string]uint8{}, map[string]map[string]uint8{}
	m.legacyVMs = false
	m.written, m.vmAt, m.sliverAt = map[string][]byte{}, map[string]string{}, map[string]string{}
	m.keysOf = map[string]map[string]bool{}
	m.tapRules = nil
	m.tapKeys = 0
}

// load reads the whole intent and every desired key from s, and returns
// the revision it read the intent at. m.mu is held.
func (m *model) load(ctx context.Context, s store.Store) (int64, error) {
	m.reset()
	m.loaded = false
	kvs, rev, err := s.List(ctx, intent.Prefix)
	if err != nil {
		return 0, err
	}
	// The allocations first: a subnet's own VM-ids key wins over the
	// layout of before, whatever order the keys come in.
	if v, ok := kvs[intent.AllocKey]; ok {
		if _, err := m.apply(intent.AllocKey, v, false); err != nil {
			return 0, err
		}
	}
	for k, v := range kvs {
		if k == intent.AllocKey {
			continue
		}
		if _, err := m.apply(k, v, false); err != nil {
			return 0, err
		}
	}
	for _, prefix := range []string{intent.DesiredPrefix, intent.FarmStatePrefix} {
		kvs, _, err := s.List(ctx, prefix)
		if err != nil {
			return 0, err
		}
		for k, v := range kvs {
			m.noteWritten(k, v)
		}
	}
	m.loaded = true
	return rev, nil
}

// noteWritten records that key holds v in the store (nil: no longer there).
func (m *model) noteWritten(key string, v []byte) {
	if _, kind, _, _ := intent.ParseDesiredKey(key); kind == intent.DesiredTapKind {
		if _, had := m.written[key]; had != (v != nil) {
			m.tapKeys += map[bool]int{true: 1, false: -1}[v != nil]
		}
	}
	if v == nil {
		delete(m.written, key)
	} else {
		m.written[key] = v
	}
	rest, ok := strings.CutPrefix(key, intent.DesiredPrefix)
	if !ok {
		return
	}
	host, rest, _ := strings.Cut(rest, "/")
	if v == nil {
		delete(m.keysOf[host], key)
		if len(m.keysOf[host]) == 0 {
			delete(m.keysOf, host)
		}
	} else {
		if m.keysOf[host] == nil {
			m.keysOf[host] = map[string]bool{}
		}
		m.keysOf[host][key] = true
	}
	kind, name, _ := strings.Cut(rest, "/")
	var at map[string]string
	switch kind {
	case intent.DesiredVMKind:
		at = m.vmAt
	case intent.DesiredSliverKind:
		at, name = m.sliverAt, host+"/"+name
	default:
		return
	}
	if v == nil {
		if at[name] == host {
			delete(at, name)
		}
	} else {
		at[name] = host
	}
}

// apply takes one intent key's new value (or its deletion) into the model
// and says what in the desired state it may change. m.mu is held.
func (m *model) apply(key string, v []byte, deleted bool) (*dirty, error) {
	d := newDirty()
	decode := func(into any) error {
		if err := json.Unmarshal(v, into); err != nil {
			return fmt.Errorf("decode %s: %w", key, err)
		}
		return nil
	}
	switch {
	case strings.HasPrefix(key, intent.HostsPrefix):
		name := strings.TrimPrefix(key, intent.HostsPrefix)
		if deleted {
			delete(m.hosts, name)
		} else {
			var h intent.Host
			if err := decode(&h); err != nil {
				return d, err
			}
			m.hosts[name] = h
		}
		d.hosts[name] = true
	case strings.HasPrefix(key, intent.FarmsPrefix), strings.HasPrefix(key, intent.SubnetsPrefix):
		if strings.HasPrefix(key, intent.FarmsPrefix) {
			name := strings.TrimPrefix(key, intent.FarmsPrefix)
			var f intent.Farm
			if deleted {
				delete(m.farms, name)
			} else if err := decode(&f); err != nil {
				return d, err
			} else {
				m.farms[name] = f
			}
		} else {
			name := strings.TrimPrefix(key, intent.SubnetsPrefix)
			var s intent.Subnet
			if deleted {
				delete(m.subnets, name)
			} else if err := decode(&s); err != nil {
				return d, err
			} else {
				m.subnets[name] = s
			}
		}
		d.farms, d.taps = true, true
	case strings.HasPrefix(key, intent.VMsPrefix):
		full := strings.TrimPrefix(key, intent.VMsPrefix)
		if old, ok := m.vms[full]; ok {
			delete(m.onHost[old.Host], full)
			if m.byName[old.Name] == full {
				delete(m.byName, old.Name)
			}
			d.tapsOn[old.Host] = true
			d.taps = d.taps || m.tapNames(old)
		}
		if deleted {
			delete(m.vms, full)
		} else {
			var vm intent.VM
			if err := decode(&vm); err != nil {
				delete(m.vms, full)
				return d, err
			}
			m.vms[full] = vm
			m.byName[vm.Name] = full
			if m.onHost[vm.Host] == nil {
				m.onHost[vm.Host] = map[string]bool{}
			}
			m.onHost[vm.Host][full] = true
			d.tapsOn[vm.Host] = true
			d.taps = d.taps || m.tapNames(vm)
		}
		d.vms[full] = true
	case strings.HasPrefix(key, intent.SliversPrefix):
		name := strings.TrimPrefix(key, intent.SliversPrefix)
		if deleted {
			delete(m.slivers, name)
		} else {
			var s intent.Sliver
			if err := decode(&s); err != nil {
				return d, err
			}
			m.slivers[name] = s
		}
		d.slivers[name] = true
	case strings.HasPrefix(key, intent.TapsPrefix):
		name := strings.TrimPrefix(key, intent.TapsPrefix)
		if deleted {
			delete(m.taps, name)
		} else {
			var p intent.TapPolicy
			if err := decode(&p); err != nil {
				return d, err
			}
			m.taps[name] = p
		}
		d.taps = true
	case key == intent.AllocKey:
		var a ipam.Allocations
		if !deleted {
			if err := decode(&a); err != nil {
				return d, err
			}
		}
		m.allocFarms, m.allocSubnets = orEmpty(a.Farms), orEmpty(a.Subnets)
		if len(a.VMs) > 0 {
			// The layout before intent.VMIDsPrefix: take the VM ids from here
			// for every subnet that has no key of its own yet.
			m.legacyVMs = true
			for full, id := range a.VMs {
				i := strings.LastIndexByte(full, '/')
				if i < 0 {
					continue
				}
				sub := full[:i]
				if m.vmids[sub] == nil {
					m.vmids[sub] = map[string]uint8{}
				}
				if _, own := m.vmids[sub][full[i+1:]]; !own {
					m.vmids[sub][full[i+1:]] = id
				}
			}
		}
	case strings.HasPrefix(key, intent.VMIDsPrefix):
		sub := strings.TrimPrefix(key, intent.VMIDsPrefix)
		ids := map[string]uint8{}
		if !deleted {
			if err := decode(&ids); err != nil {
				return d, err
			}
		}
		if len(ids) == 0 {
			delete(m.vmids, sub)
		} else {
			m.vmids[sub] = ids
		}
	}
	return d, nil
}

// tapNames reports whether a TAP policy names vm (by name, address or MAC)
// as its sender, receiver or monitor: only then can a change of vm change
// the compiled rules. Which hosts play a part in a rule that names a
// subnet or any VM follows from the VMs of each host alone (the tapsOn of
// the hosts vm leaves and joins).
func (m *model) tapNames(vm intent.VM) bool {
	for _, p := range m.taps {
		for _, end := range []string{p.Sender, p.Receiver, p.Monitor} {
			r, err := tappolicy.ParseRef(end)
			if err != nil {
				return true // cannot tell: compile the rules again
			}
			switch r.Kind {
			case tappolicy.KindVM:
				if r.Named() == vm.FullName() {
					return true
				}
			case tappolicy.KindIP:
				if r.IP.String() == vm.IP {
					return true
				}
			case tappolicy.KindMAC:
				if strings.EqualFold(r.MAC, vm.MAC) {
					return true
				}
			}
		}
	}
	return false
}

func orEmpty(m map[string]uint8) map[string]uint8 {
	if m == nil {
		return map[string]uint8{}
	}
	return m
}

// writer writes desired keys: the store beneath the controller's tracking.
type writer interface {
	Put(ctx context.Context, key string, value []byte) error
	Delete(ctx context.Context, key string) error
}

// compile writes the desired keys d may have changed, where they differ
// from what the store holds. m.mu is held. Its cost grows with what d
// names (a VM, a host's keys, the farms' states), not with the cloud; the
// exception is a change of a TAP policy, or of a VM one names, which
// resolves the policies against every VM (docs/control-plane.md).
func (m *model) compile(ctx context.Context, w writer, d *dirty) (writes int, err error) {
	put := func(key string, v []byte) error {
		if cur, ok := m.written[key]; ok && bytes.Equal(cur, v) {
			return nil
		}
		if err := w.Put(ctx, key, v); err != nil {
			return err
		}
		writes++
		m.noteWritten(key, v)
		return nil
	}
	del := func(key string) error {
		if _, ok := m.written[key]; !ok {
			return nil
		}
		if err := w.Delete(ctx, key); err != nil {
			return err
		}
		writes++
		m.noteWritten(key, nil)
		return nil
	}
	if d.farms {
		want := map[string][]byte{}
		for id, f := range policy.FarmStates(m.farmList(), m.subnetList()) {
			want[intent.FarmStateKey(id)] = mustJSON(f)
		}
		if err := m.sync(m.farmKeys(), intent.FarmStatePrefix, want, put, del); err != nil {
			return writes, err
		}
	}
	if d.taps {
		rules := []intent.TapRule(nil)
		if len(m.taps) > 0 {
			rules = policy.TapRules(policy.State{Farms: m.farmList(), Subnets: m.subnetList(), VMs: m.vmList(), Taps: m.tapList()})
		}
		if !equalJSON(rules, m.tapRules) {
			m.tapRules = rules
			for h := range m.hosts {
				d.tapsOn[h] = true
			}
			for h := range m.keysOf {
				d.tapsOn[h] = true
			}
		}
	}
	for h := range d.hosts {
		for full := range m.onHost[h] {
			d.vms[full] = true
		}
		for name, s := range m.slivers {
			if s.Host == h {
				d.slivers[name] = true // a host's slivers are few
			}
		}
		for k := range m.keysOf[h] {
			rest := strings.TrimPrefix(k, intent.DesiredHostPrefix(h))
			kind, name, _ := strings.Cut(rest, "/")
			switch kind {
			case intent.DesiredVMKind:
				d.vms[name] = true
			case intent.DesiredSliverKind:
				d.slivers[h+"/"+name] = true
			}
		}
		d.tapsOn[h] = true
	}
	for _, full := range sortedKeys(d.vms) {
		var want string
		if vm, ok := m.vms[full]; ok {
			if _, ok := m.hosts[vm.Host]; ok {
				want = intent.DesiredVMKey(vm.Host, full)
			}
		}
		if at, ok := m.vmAt[full]; ok && intent.DesiredVMKey(at, full) != want {
			if err := del(intent.DesiredVMKey(at, full)); err != nil {
				return writes, err
			}
		}
		if want != "" {
			if err := put(want, mustJSON(policy.LocalEndpoint(m.vms[full]))); err != nil {
				return writes, err
			}
		}
	}
	for _, name := range sortedKeys(d.slivers) {
		var want string
		s, ok := m.slivers[name]
		if ok {
			if _, ok := m.hosts[s.Host]; ok {
				want = intent.DesiredSliverKey(s.Host, s.Name)
			}
		}
		if at, ok := m.sliverAt[name]; ok {
			_, sname, _ := strings.Cut(name, "/")
			if k := intent.DesiredSliverKey(at, sname); k != want {
				if err := del(k); err != nil {
					return writes, err
				}
			}
		}
		if want != "" {
			if err := put(want, mustJSON(policy.LocalSliver(s))); err != nil {
				return writes, err
			}
		}
	}
	if len(m.tapRules) == 0 && m.tapKeys == 0 {
		d.tapsOn = nil // no TAP anywhere: nothing to look at
	}
	for _, h := range sortedKeys(d.tapsOn) {
		want := map[string][]byte{}
		if _, ok := m.hosts[h]; ok && len(m.tapRules) > 0 {
			var local []intent.VM
			for full := range m.onHost[h] {
				local = append(local, m.vms[full])
			}
			for _, r := range policy.LocalTaps(m.tapRules, local, h) {
				want[intent.DesiredTapKey(h, r.ID)] = mustJSON(r)
			}
		}
		if len(want) == 0 && len(m.keysOf[h]) == 0 {
			continue
		}
		if err := m.sync(m.keysOf[h], intent.DesiredKindPrefix(h, intent.DesiredTapKind), want, put, del); err != nil {
			return writes, err
		}
	}
	return writes, nil
}

// sync makes the written keys under prefix (of those in have) exactly want.
func (m *model) sync(have map[string]bool, prefix string, want map[string][]byte, put func(string, []byte) error, del func(string) error) error {
	var stale []string
	for k := range have {
		if _, ok := want[k]; !ok && strings.HasPrefix(k, prefix) {
			stale = append(stale, k)
		}
	}
	sort.Strings(stale)
	for _, k := range stale {
		if err := del(k); err != nil {
			return err
		}
	}
	for _, k := range sortedKeys(want) {
		if err := put(k, want[k]); err != nil {
			return err
		}
	}
	return nil
}

// farmKeys are the farm-state keys written: at most 255.
func (m *model) farmKeys() map[string]bool {
	out := map[string]bool{}
	for id := range 256 {
		if k := intent.FarmStateKey(uint8(id)); m.written[k] != nil {
			out[k] = true
		}
	}
	return out
}

// compileAll writes every desired key the intent makes and deletes every
// other one: what a full compile does after a load.
func (m *model) compileAll(ctx context.Context, w writer) (int, error) {
	d := newDirty()
	d.farms, d.taps = true, true
	m.tapRules = nil
	for full := range m.vms {
		d.vms[full] = true
	}
	for full := range m.vmAt {
		d.vms[full] = true
	}
	for name := range m.slivers {
		d.slivers[name] = true
	}
	for name := range m.sliverAt {
		d.slivers[name] = true
	}
	for h := range m.hosts {
		d.tapsOn[h] = true
	}
	for h := range m.keysOf {
		d.tapsOn[h] = true
	}
	writes, err := m.compile(ctx, w, d)
	if err != nil {
		return writes, err
	}
	// Whatever else is under the desired prefix (the one-value-per-host
	// layout of before, a host's key of a kind no longer written) goes.
	var stale []string
	for k := range m.written {
		if rest, ok := strings.CutPrefix(k, intent.DesiredPrefix); ok {
			h, kind, _ := strings.Cut(rest, "/")
			kind, _, _ = strings.Cut(kind, "/")
			_, host := m.hosts[h]
			if !host || (kind != intent.DesiredVMKind && kind != intent.DesiredSliverKind && kind != intent.DesiredTapKind) {
				stale = append(stale, k)
			}
		}
	}
	sort.Strings(stale)
	for _, k := range stale {
		if err := w.Delete(ctx, k); err != nil {
			return writes, err
		}
		writes++
		m.noteWritten(k, nil)
	}
	return writes, nil
}

func (m *model) farmList() []intent.Farm {
	out := make([]intent.Farm, 0, len(m.farms))
	for _, k := range sortedKeys(m.farms) {
		out = append(out, m.farms[k])
	}
	return out
}

func (m *model) subnetList() []intent.Subnet {
	out := make([]intent.Subnet, 0, len(m.subnets))
	for _, k := range sortedKeys(m.subnets) {
		out = append(out, m.subnets[k])
	}
	return out
}

func (m *model) vmList() []intent.VM {
	out := make([]intent.VM, 0, len(m.vms))
	for _, k := range sortedKeys(m.vms) {
		out = append(out, m.vms[k])
	}
	return out
}

func (m *model) tapList() []intent.TapPolicy {
	out := make([]intent.TapPolicy, 0, len(m.taps))
	for _, k := range sortedKeys(m.taps) {
		out = append(out, m.taps[k])
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("encode %T: %v", v, err)) // records of strings and numbers
	}
	return b
}

func equalJSON(a, b any) bool { return bytes.Equal(mustJSON(a), mustJSON(b)) }

// allocations returns a copy of the allocations: the farm and subnet ids,
// and the VM ids of the subnets named (every subnet when none is).
func (m *model) allocations(subnets ...string) *ipam.Allocations {
	a := &ipam.Allocations{Farms: maps.Clone(m.allocFarms), Subnets: maps.Clone(m.allocSubnets), VMs: map[string]uint8{}}
	add := func(sub string) {
		for vm, id := range m.vmids[sub] {
			a.VMs[sub+"/"+vm] = id
		}
	}
	if len(subnets) == 0 {
		for sub := range m.vmids {
			add(sub)
		}
	}
	for _, sub := range subnets {
		add(sub)
	}
	return a
}
