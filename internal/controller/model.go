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
	"github.com/onehop/onehop/internal/store"
)

// model is the controller's copy of the intent and of the desired keys it
// has written, kept so that a change costs what it touches and not what the
// cloud holds (docs/control-plane.md). The controller is intent's only
// writer: every Put or Delete it makes goes through tracked, which applies
// it here and writes the desired keys it changes. It is loaded from the
// store on first use and again by every full compile (CompileOnce), which
// also catches anything written behind the controller's back.
//
// The model keeps the core's records itself; each part of the desired
// state keeps its own and compiles its keys (records.go).
type model struct {
	mu     sync.Mutex
	loaded bool

	hosts   map[string]intent.Host
	farms   map[string]intent.Farm
	subnets map[string]intent.Subnet // FARM/SUBNET
	vms     map[string]intent.VM     // FARM/SUBNET/VM
	// byName is every VM (FARM/SUBNET/VM) of each name: a name is unique
	// within its farm only, so blue/web1 and red/web1 are both under web1.
	byName map[string]map[string]bool
	onHost map[string]map[string]bool
	// onIface is the VMs (FARM/SUBNET/VM) on each host interface
	// (ifaceKey): a create checks its interface is free without a scan
	// of the host's VMs, which made creates slow down as hosts filled.
	onIface map[ifaceKey]map[string]bool

	// Allocations: farm and subnet ids (intent.AllocKey) and, per subnet,
	// its VMs' host ids (intent.VMIDsPrefix). legacyVMs says the store
	// still holds the VM ids in intent.AllocKey, as before
	// intent.VMIDsPrefix: the next save writes every subnet's key.
	allocFarms, allocSubnets map[string]uint16
	vmids                    map[string]map[string]uint32
	legacyVMs                bool

	// written is every desired and farm-state key as the store holds it;
	// keysOf is each host's desired keys, and counts how many of each
	// kind there are on all hosts.
	written map[string][]byte
	keysOf  map[string]map[string]bool
	counts  map[string]int

	// parts are the parts of the desired state (records.go), kinds every
	// kind of record the model keeps, and byKind the part that writes
	// each kind of desired key.
	parts  []part
	kinds  []recordKind
	byKind map[string]part
}

func (m *model) reset() {
	if m.parts == nil {
		m.parts = parts()
		m.kinds = recordKinds(m.parts)
		m.byKind = map[string]part{}
		for _, p := range m.parts {
			if k := p.desiredKind(); k != "" {
				m.byKind[k] = p
			}
		}
	}
	m.hosts, m.farms, m.subnets = map[string]intent.Host{}, map[string]intent.Farm{}, map[string]intent.Subnet{}
	m.vms, m.byName, m.onHost = map[string]intent.VM{}, map[string]map[string]bool{}, map[string]map[string]bool{}
	m.onIface = map[ifaceKey]map[string]bool{}
	m.allocFarms, m.allocSubnets, m.vmids = map[string]uint16{}, map[string]uint16{}, map[string]map[string]uint32{}
	m.legacyVMs = false
	m.written, m.keysOf, m.counts = map[string][]byte{}, map[string]map[string]bool{}, map[string]int{}
	for _, p := range m.parts {
		p.reset()
	}
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
	// Kind by kind, in the order recordKinds lists them.
	byKind := make([][]string, len(m.kinds))
	for k := range kvs {
		if i, _, ok := m.kindOf(k); ok {
			byKind[i] = append(byKind[i], k)
		}
	}
	for _, keys := range byKind {
		for _, k := range keys {
			if err := m.apply(k, kvs[k], false); err != nil {
				return 0, err
			}
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
	_, had := m.written[key]
	if v == nil {
		delete(m.written, key)
	} else {
		m.written[key] = v
	}
	host, kind, name, ok := intent.ParseDesiredKey(key)
	if !ok {
		return
	}
	switch {
	case v != nil && !had:
		m.counts[kind]++
	case v == nil && had:
		m.counts[kind]--
	}
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
	if p := m.byKind[kind]; p != nil {
		p.noted(host, name, v != nil)
	}
}

// desiredNames lists the names of host's desired keys of kind that the
// store holds.
func (m *model) desiredNames(host, kind string) []string {
	var out []string
	for k := range m.keysOf[host] {
		if _, kk, name, _ := intent.ParseDesiredKey(k); kk == kind {
			out = append(out, name)
		}
	}
	return out
}

// kindOf returns the index in m.kinds of the kind of record key is, and
// the record's name.
func (m *model) kindOf(key string) (int, string, bool) {
	for i, k := range m.kinds {
		if name, ok := k.claims(key); ok {
			return i, name, true
		}
	}
	return 0, "", false
}

// apply takes one intent key's new value (or its deletion) into the model
// and marks, in the parts, what in the desired state it may change. A key
// of no kind the model keeps is ignored. m.mu is held.
func (m *model) apply(key string, v []byte, deleted bool) error {
	i, name, ok := m.kindOf(key)
	if !ok {
		return nil
	}
	if err := m.kinds[i].apply(m, name, v, deleted); err != nil {
		return fmt.Errorf("decode %s: %w", key, err)
	}
	return nil
}

func (m *model) applyHost(name string, v []byte, deleted bool) error {
	if err := applyRecord(m.hosts, name, v, deleted); err != nil {
		return err
	}
	for _, p := range m.parts {
		p.hostChanged(m, name)
	}
	return nil
}

func (m *model) applyFarm(name string, v []byte, deleted bool) error {
	if err := applyRecord(m.farms, name, v, deleted); err != nil {
		return err
	}
	m.farmsChanged()
	return nil
}

func (m *model) applySubnet(name string, v []byte, deleted bool) error {
	if err := applyRecord(m.subnets, name, v, deleted); err != nil {
		return err
	}
	m.farmsChanged()
	return nil
}

func (m *model) farmsChanged() {
	for _, p := range m.parts {
		if w, ok := p.(farmWatcher); ok {
			w.farmsChanged(m)
		}
	}
}

func (m *model) applyVM(full string, v []byte, deleted bool) error {
	var old *intent.VM
	if vm, ok := m.vms[full]; ok {
		old = &vm
		delete(m.onHost[vm.Host], full)
		m.unsetIface(vm, full)
		delete(m.byName[vm.Name], full)
		if len(m.byName[vm.Name]) == 0 {
			delete(m.byName, vm.Name)
		}
	}
	var now *intent.VM
	if deleted {
		delete(m.vms, full)
	} else {
		var vm intent.VM
		if err := json.Unmarshal(v, &vm); err != nil {
			delete(m.vms, full)
			return err
		}
		m.vms[full] = vm
		if m.byName[vm.Name] == nil {
			m.byName[vm.Name] = map[string]bool{}
		}
		m.byName[vm.Name][full] = true
		if m.onHost[vm.Host] == nil {
			m.onHost[vm.Host] = map[string]bool{}
		}
		m.onHost[vm.Host][full] = true
		k := ifaceKey{vm.Host, vm.Interface}
		if m.onIface[k] == nil {
			m.onIface[k] = map[string]bool{}
		}
		m.onIface[k][full] = true
		now = &vm
	}
	for _, p := range m.parts {
		if w, ok := p.(vmWatcher); ok {
			w.vmChanged(m, full, old, now)
		}
	}
	return nil
}

// namedIn returns the VM (FARM/SUBNET/VM) of farm named name, "" if farm
// has none: a name is unique within its farm.
func (m *model) namedIn(farm, name string) string {
	for full := range m.byName[name] {
		if strings.HasPrefix(full, farm+"/") {
			return full
		}
	}
	return ""
}

// ifaceKey is a host interface: a host and the name of its interface.
type ifaceKey struct{ host, iface string }

// unsetIface takes vm (full) off its host interface in onIface.
func (m *model) unsetIface(vm intent.VM, full string) {
	k := ifaceKey{vm.Host, vm.Interface}
	delete(m.onIface[k], full)
	if len(m.onIface[k]) == 0 {
		delete(m.onIface, k)
	}
}

// applyAlloc takes intent.AllocKey: the farm and subnet ids.
func (m *model) applyAlloc(_ string, v []byte, deleted bool) error {
	var a ipam.Allocations
	if !deleted {
		if err := json.Unmarshal(v, &a); err != nil {
			return err
		}
	}
	m.allocFarms, m.allocSubnets = orEmpty(a.Farms), orEmpty(a.Subnets)
	if len(a.VMs) > 0 {
		// The layout before intent.VMIDsPrefix: take the VM ids from
		// here for every subnet that has no key of its own yet.
		m.legacyVMs = true
		for full, id := range a.VMs {
			i := strings.LastIndexByte(full, '/')
			if i < 0 {
				continue
			}
			sub := full[:i]
			if m.vmids[sub] == nil {
				m.vmids[sub] = map[string]uint32{}
			}
			if _, own := m.vmids[sub][full[i+1:]]; !own {
				m.vmids[sub][full[i+1:]] = id
			}
		}
	}
	return nil
}

// applyVMIDs takes the VM ids of one subnet (FARM/SUBNET).
func (m *model) applyVMIDs(sub string, v []byte, deleted bool) error {
	ids := map[string]uint32{}
	if !deleted {
		if err := json.Unmarshal(v, &ids); err != nil {
			return err
		}
	}
	if len(ids) == 0 {
		delete(m.vmids, sub)
	} else {
		m.vmids[sub] = ids
	}
	return nil
}

func orEmpty(m map[string]uint16) map[string]uint16 {
	if m == nil {
		return map[string]uint16{}
	}
	return m
}

// compile writes the desired keys the changes applied since the last
// compile may have changed, where they differ from what the store holds,
// part by part. m.mu is held. Its cost grows with what the changes touch
// (a VM, a host's keys, the farms' states), not with the cloud; the
// exception is a change of a TAP policy, or of a VM one names, which
// resolves the policies against every VM (docs/control-plane.md).
func (m *model) compile(ctx context.Context, w writer) (writes int, err error) {
	kw := &keyWriter{ctx: ctx, w: w, m: m}
	for _, p := range m.parts {
		if err := p.compile(m, kw); err != nil {
			return kw.writes, err
		}
	}
	return kw.writes, nil
}

// compileAll writes every desired key the intent makes and deletes every
// other one: what a full compile does after a load.
func (m *model) compileAll(ctx context.Context, w writer) (int, error) {
	for _, p := range m.parts {
		p.markAll(m)
	}
	writes, err := m.compile(ctx, w)
	if err != nil {
		return writes, err
	}
	// Whatever else is under the desired prefix (the one-value-per-host
	// layout of before, a host's key of a kind no part writes) goes.
	var stale []string
	for k := range m.written {
		if h, kind, _, ok := intent.ParseDesiredKey(k); ok {
			if _, host := m.hosts[h]; !host || m.byKind[kind] == nil {
				stale = append(stale, k)
			}
		}
	}
	sort.Strings(stale)
	kw := &keyWriter{ctx: ctx, w: w, m: m, writes: writes}
	for _, k := range stale {
		if err := kw.del(k); err != nil {
			return kw.writes, err
		}
	}
	return kw.writes, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// sortedValues lists m's values in the order of their keys.
func sortedValues[V any](m map[string]V) []V {
	out := make([]V, 0, len(m))
	for _, k := range sortedKeys(m) {
		out = append(out, m[k])
	}
	return out
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
	a := &ipam.Allocations{Farms: maps.Clone(m.allocFarms), Subnets: maps.Clone(m.allocSubnets), VMs: map[string]uint32{}}
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
