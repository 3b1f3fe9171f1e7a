package datapath

import (
	"errors"
	"fmt"
	"maps"

	"github.com/cilium/ebpf"
)

// A rule set (visibility rules, firewalls and their rules) changes without
// any packet ever being judged by part of one set and part of another: the
// new set is written under the generation not in force, the node's
// policy_epoch moves on by one (its low bit is the generation the programs
// read), the agent waits until no program can still be running under the
// old epoch, and only then deletes the old set. See bpf/lib/policy_maps.h.

// policySet is one rule set, its keys with generation 0.
type policySet struct {
	vis   map[VisKey]uint8
	fw    map[uint32]FwPolicy
	rules map[FwKey]FwRule
}

func (s policySet) equal(o policySet) bool {
	return maps.Equal(s.vis, o.vis) && maps.Equal(s.fw, o.fw) && maps.Equal(s.rules, o.rules)
}

func (s policySet) empty() bool { return len(s.vis)+len(s.fw)+len(s.rules) == 0 }

func newPolicySet() policySet {
	return policySet{vis: map[VisKey]uint8{}, fw: map[uint32]FwPolicy{}, rules: map[FwKey]FwRule{}}
}

// readPolicy reads both generations as the maps hold them.
func (k *Kernel) readPolicy() ([2]policySet, error) {
	sets := [2]policySet{newPolicySet(), newPolicySet()}
	var vk VisKey
	var vv uint8
	it := k.vif.Visibility.Iterate()
	for it.Next(&vk, &vv) {
		g := vk.Gen & 1
		vk.Gen = 0
		sets[g].vis[vk] = vv
	}
	if err := it.Err(); err != nil {
		return sets, fmt.Errorf("read visibility: %w", err)
	}
	var pk FwPolicyKey
	var pv FwPolicy
	it = k.vif.Firewalls.Iterate()
	for it.Next(&pk, &pv) {
		sets[pk.Gen&1].fw[pk.Vm] = pv
	}
	if err := it.Err(); err != nil {
		return sets, fmt.Errorf("read firewalls: %w", err)
	}
	var rk FwKey
	var rv FwRule
	it = k.vif.FirewallRules.Iterate()
	for it.Next(&rk, &rv) {
		g := rk.Gen & 1
		rk.Gen = 0
		sets[g].rules[rk] = rv
	}
	if err := it.Err(); err != nil {
		return sets, fmt.Errorf("read firewall rules: %w", err)
	}
	return sets, nil
}

// step is one write to the maps. Apply runs a plan's steps in order and
// stops at the first that fails, so a rule set is never switched to before
// it is whole; the next reconcile starts again from what the maps hold.
type step struct {
	what string
	do   func() error
}

func put[K, V any](m *ebpf.Map, what string, k K, v V) step {
	return step{what, func() error {
		if err := m.Put(k, v); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}}
}

func del[K any](m *ebpf.Map, what string, k K) step {
	return step{what, func() error {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}}
}

// writeSet writes s under generation gen: rules before the policies whose
// counts cover them, both before the visibility rules (order within a
// generation not in force matters only for tidiness; the programs read it
// only once it is whole).
func (k *Kernel) writeSet(s policySet, gen uint8) []step {
	var steps []step
	for key, r := range s.rules {
		key.Gen = gen
		steps = append(steps, put(k.vif.FirewallRules, fmt.Sprintf("write firewall rule (gen %d)", gen), key, r))
	}
	for vm, p := range s.fw {
		steps = append(steps, put(k.vif.Firewalls, fmt.Sprintf("write firewall of %s (gen %d)", KeyIP(vm), gen), FwPolicyKey{Vm: vm, Gen: gen}, p))
	}
	for key, v := range s.vis {
		key.Gen = gen
		steps = append(steps, put(k.vif.Visibility, fmt.Sprintf("write visibility rule (gen %d)", gen), key, v))
	}
	return steps
}

// deleteSet deletes s from generation gen: visibility rules, then policies,
// then their rules (a policy never counts a rule already gone).
func (k *Kernel) deleteSet(s policySet, gen uint8) []step {
	var steps []step
	for key := range s.vis {
		key.Gen = gen
		steps = append(steps, del(k.vif.Visibility, fmt.Sprintf("delete visibility rule (gen %d)", gen), key))
	}
	for vm := range s.fw {
		steps = append(steps, del(k.vif.Firewalls, fmt.Sprintf("delete firewall of %s (gen %d)", KeyIP(vm), gen), FwPolicyKey{Vm: vm, Gen: gen}))
	}
	for key := range s.rules {
		key.Gen = gen
		steps = append(steps, del(k.vif.FirewallRules, fmt.Sprintf("delete firewall rule (gen %d)", gen), key))
	}
	return steps
}

// waitForPrograms returns once every BPF program that was running when it
// was called has finished. The kernel waits for an RCU grace period on
// every update of a map-in-map from user space (maybe_wait_bpf_programs in
// kernel/bpf/syscall.c) "so that userspace, when we return to it, knows
// that all programs that could be running use the new map value"; tc
// programs run inside an RCU read-side section, so after it none still
// works with an epoch read before the switch.
func (k *Kernel) waitForPrograms() error {
	if err := k.barrier.Put(uint32(0), k.barrierInner); err != nil {
		return fmt.Errorf("wait for running programs: %w", err)
	}
	return nil
}

// newBarrier makes the map-in-map whose updates waitForPrograms uses. No
// program reads it.
func newBarrier() (outer, inner *ebpf.Map, err error) {
	innerSpec := &ebpf.MapSpec{Name: "onehop_barrier_i", Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1}
	inner, err = ebpf.NewMap(innerSpec)
	if err != nil {
		return nil, nil, fmt.Errorf("barrier map: %w", err)
	}
	outer, err = ebpf.NewMap(&ebpf.MapSpec{Name: "onehop_barrier", Type: ebpf.ArrayOfMaps, KeySize: 4, ValueSize: 4,
		MaxEntries: 1, InnerMap: innerSpec})
	if err != nil {
		inner.Close()
		return nil, nil, fmt.Errorf("barrier map: %w", err)
	}
	return outer, inner, nil
}

// withFlags returns want with each entry's firewall flag also set where the
// map holds it set now. While two rule sets are in the maps, a VM that has
// a firewall in either must have its flag: a flag set where the set in
// force has no firewall costs a lookup and allows (no firewall), but a flag
// clear where it has one would skip that firewall.
func withFlags[K comparable, V any](m *ebpf.Map, want map[K]V, flag func(*V) *uint8) (map[K]V, error) {
	out := make(map[K]V, len(want))
	for key, v := range want {
		var cur V
		if err := m.Lookup(key, &cur); err == nil && *flag(&cur) != 0 {
			*flag(&v) = 1
		} else if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, fmt.Errorf("read flags: %w", err)
		}
		out[key] = v
	}
	return out, nil
}
