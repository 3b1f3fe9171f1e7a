package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"sort"
	"strings"

	"github.com/onehop/onehop/internal/intent"
)

// The controller compiles the intent into the desired state in parts: the
// core's (the farm states and each VM's key, from the hosts, farms,
// subnets and VMs the model keeps itself) and one per feature with intent
// records or desired keys of its own. A new feature adds its line to
// parts and its part in a file of its own (model_FEATURE.go), with its key
// layout in intent; the model dispatches every record and every desired
// key through these lists and knows no feature by name
// (docs/control-plane.md).

// parts returns every part of the desired state, in the order a compile
// writes their keys.
func parts() []part {
	return []part{
		&farmStates{}, // intent.FarmStatePrefix: each farm's rules, peerings and proxy ARP
		&vmKeys{},     // intent.DesiredVMKind: each VM on its host
		&sliverKeys{}, // port-space: intent.SliversPrefix into intent.DesiredSliverKind
		&tapKeys{},    // TAP: intent.TapsPrefix into intent.DesiredTapKind
	}
}

// recordKinds lists every kind of intent record the model keeps: its own,
// then each part's. A load applies them kind by kind in this order: the
// allocations before the VM ids of each subnet, whose own key wins over
// the layout of before (applyAlloc).
func recordKinds(ps []part) []recordKind {
	kinds := []recordKind{
		{key: intent.AllocKey, apply: (*model).applyAlloc},
		{prefix: intent.VMIDsPrefix, apply: (*model).applyVMIDs},
		{prefix: intent.HostsPrefix, apply: (*model).applyHost},
		{prefix: intent.FarmsPrefix, apply: (*model).applyFarm},
		{prefix: intent.SubnetsPrefix, apply: (*model).applySubnet},
		{prefix: intent.VMsPrefix, apply: (*model).applyVM},
	}
	for _, p := range ps {
		kinds = append(kinds, p.records()...)
	}
	return kinds
}

// recordKind is one kind of intent record the model keeps.
type recordKind struct {
	// prefix is where the kind's records live (an intent.*Prefix); a
	// record's name is the rest of its key. key instead is the kind's one
	// record (intent.AllocKey), whose name is "".
	prefix, key string
	// apply takes a record's new value, or its deletion, into the model
	// and marks in the parts what of the desired state it may change. Its
	// error is the value's that does not decode.
	apply func(m *model, name string, v []byte, deleted bool) error
}

// applyRecord is how most kinds apply a record: decoded into records under
// its name, or deleted from them.
func applyRecord[T any](records map[string]T, name string, v []byte, deleted bool) error {
	if deleted {
		delete(records, name)
		return nil
	}
	var r T
	if err := json.Unmarshal(v, &r); err != nil {
		return err
	}
	records[name] = r
	return nil
}

// markEach marks every key of keys.
func markEach[V any](marks map[string]bool, keys map[string]V) {
	for k := range keys {
		marks[k] = true
	}
}

// takeMarks returns the marked keys in order and clears the marks: what a
// part's compile writes.
func takeMarks(marks *map[string]bool) []string {
	keys := sortedKeys(*marks)
	*marks = map[string]bool{}
	return keys
}

// claims reports whether key is a record of the kind, and its name.
func (k recordKind) claims(key string) (string, bool) {
	if k.key != "" {
		return "", key == k.key
	}
	return strings.CutPrefix(key, k.prefix)
}

// part is one part of the desired state with the intent records it is
// compiled from. It keeps its own records and what it must write next:
// applying a record marks, compile writes what is marked. Its methods run
// with the model's lock held.
type part interface {
	// records are the kinds of intent record the part keeps, if any.
	records() []recordKind
	// desiredKind is the kind of key the part writes under a host's
	// desired prefix (an intent.Desired*Kind); "" for none.
	desiredKind() string
	// reset forgets every record, key and mark: a load follows.
	reset()
	// noted hears that host's desired key name of the part's kind is in
	// the store (present) or no longer.
	noted(host, name string, present bool)
	// hostChanged marks the part's keys of host: its host record changed
	// (came, went or was rewritten).
	hostChanged(m *model, host string)
	// markAll marks every key the part makes or has written: a full
	// compile follows.
	markAll(m *model)
	// compile writes the keys marked since its last compile, where they
	// differ from the store, and deletes those the intent no longer makes.
	compile(m *model, w *keyWriter) error
}

// farmWatcher is a part compiled from the farms and subnets: it hears of
// every change of one.
type farmWatcher interface {
	farmsChanged(m *model)
}

// vmWatcher is a part compiled from the VMs: it hears of every change of
// one, the VM (FARM/SUBNET/VM) as it was and as it is (nil: none).
type vmWatcher interface {
	vmChanged(m *model, full string, old, now *intent.VM)
}

// keyWriter writes desired and farm-state keys where they differ from what
// the store holds, and counts what it wrote.
type keyWriter struct {
	ctx    context.Context
	w      writer
	m      *model
	writes int
}

// writer writes desired keys: the store beneath the controller's tracking.
type writer interface {
	Put(ctx context.Context, key string, value []byte) error
	Delete(ctx context.Context, key string) error
}

// put writes key unless the store holds v there already.
func (k *keyWriter) put(key string, v []byte) error {
	if cur, ok := k.m.written[key]; ok && bytes.Equal(cur, v) {
		return nil
	}
	if err := k.w.Put(k.ctx, key, v); err != nil {
		return err
	}
	k.writes++
	k.m.noteWritten(key, v)
	return nil
}

// del deletes key if the store holds it.
func (k *keyWriter) del(key string) error {
	if _, ok := k.m.written[key]; !ok {
		return nil
	}
	if err := k.w.Delete(k.ctx, key); err != nil {
		return err
	}
	k.writes++
	k.m.noteWritten(key, nil)
	return nil
}

// sync makes the written keys under prefix (of those in have) exactly want.
func (k *keyWriter) sync(have map[string]bool, prefix string, want map[string][]byte) error {
	var stale []string
	for key := range have {
		if _, ok := want[key]; !ok && strings.HasPrefix(key, prefix) {
			stale = append(stale, key)
		}
	}
	sort.Strings(stale)
	for _, key := range stale {
		if err := k.del(key); err != nil {
			return err
		}
	}
	for _, key := range sortedKeys(want) {
		if err := k.put(key, want[key]); err != nil {
			return err
		}
	}
	return nil
}
