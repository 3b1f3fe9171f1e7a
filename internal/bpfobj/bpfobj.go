// Package bpfobj is what every feature's loader shares, written once: the
// router's (internal/datapath), port space's, VNAT's and the LISP data
// plane's. It names counters from an object's BTF, sums per-CPU counters,
// loads one object on another's pinned maps, and keeps the links a loader
// attaches by name, pinned when the loader pins. It is kernel code (it
// imports cilium/ebpf) and knows no feature.
package bpfobj

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/onehop/onehop/internal/addrplan"
)

// SetPlan gives an object built from bpf/lib/route.h the address plan's
// split (its plan_* constants) before it is loaded. An object without
// them (one that decomposes no address) is left as it is.
func SetPlan(spec *ebpf.CollectionSpec, p addrplan.Plan) error {
	for name, v := range map[string]int{"plan_farm_bits": p.FarmBits, "plan_subnet_bits": p.SubnetBits, "plan_vm_bits": p.VMBits} {
		vs, ok := spec.Variables[name]
		if !ok {
			continue
		}
		if err := vs.Set(uint32(v)); err != nil {
			return fmt.Errorf("address plan %v: set %s: %w", p, name, err)
		}
	}
	return nil
}

// EnumNames reads the C enum typ from spec's BTF and names each value as
// the metrics do: the enumerator without prefix, in lower case, at the
// index of its value ("" where no enumerator has that value; the first
// enumerator wins where two share one). An enumerator ending in _MAX counts
// the others and names nothing, so Go never repeats the C's list.
func EnumNames(spec *ebpf.CollectionSpec, typ, prefix string) ([]string, error) {
	var e *btf.Enum
	if err := spec.Types.TypeByName(typ, &e); err != nil {
		return nil, fmt.Errorf("btf enum %s: %w", typ, err)
	}
	var names []string
	for _, v := range e.Values {
		if strings.HasSuffix(v.Name, "_MAX") {
			continue
		}
		for uint64(len(names)) < v.Value {
			names = append(names, "")
		}
		if uint64(len(names)) == v.Value {
			names = append(names, strings.ToLower(strings.TrimPrefix(v.Name, prefix)))
		}
	}
	return names, nil
}

// Counters reads a per-CPU array of uint64 counters, the i-th named
// names[i], and returns each summed over CPUs by its name. A slot named ""
// is not read.
func Counters(m *ebpf.Map, names []string) (map[string]uint64, error) {
	out := make(map[string]uint64, len(names))
	var per []uint64
	for i, name := range names {
		if name == "" {
			continue
		}
		if err := m.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("read counter %s: %w", name, err)
		}
		var sum uint64
		for _, v := range per {
			sum += v
		}
		out[name] = sum
	}
	return out, nil
}

// MapsByName lists the *ebpf.Map fields of a bpf2go objects struct (or of
// its maps struct) by their `ebpf:"name"` tags, the names the C gives them.
func MapsByName(objs any) map[string]*ebpf.Map {
	out := map[string]*ebpf.Map{}
	v := reflect.ValueOf(objs).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		if m, ok := v.Field(i).Interface().(*ebpf.Map); ok && f.Tag.Get("ebpf") != "" && m != nil {
			out[f.Tag.Get("ebpf")] = m
		}
	}
	return out
}

// LoadOn loads spec into objs (a bpf2go objects struct) on maps another
// object already loaded: every pinned map of spec is the one of its name in
// shared, sized as that one is (a size set at load, a flag's), and its
// plan constants are the process's address plan (addrplan.Current). Maps spec
// does not pin are its own (.bss, a test hook's log). what names spec's
// program in errors, owner the object whose maps it shares.
func LoadOn(spec *ebpf.CollectionSpec, objs any, shared map[string]*ebpf.Map, what, owner string) error {
	if err := SetPlan(spec, addrplan.Current()); err != nil {
		return fmt.Errorf("load %s program: %w", what, err)
	}
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{}}
	for name, ms := range spec.Maps {
		if ms.Pinning == ebpf.PinNone {
			continue
		}
		m, ok := shared[name]
		if !ok {
			return fmt.Errorf("%s program uses map %s, which the %s program does not share", what, name, owner)
		}
		opts.MapReplacements[name] = m
		ms.MaxEntries = m.MaxEntries()
	}
	if err := spec.LoadAndAssign(objs, opts); err != nil {
		return fmt.Errorf("load %s program: %w", what, err)
	}
	return nil
}
