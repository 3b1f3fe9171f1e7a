package agent

import (
	"reflect"
	"slices"

	"github.com/onehop/onehop/internal/intent"
)

// logSample is how many names a log line lists at most: a line describes
// a change, and its size must not grow with the number of VMs.
const logSample = 5

// change is what one pass changed in the desired state, as counts and a
// bounded sample of names.
type change struct {
	added, removed, changed int
	sample                  []string
	rules, slivers, taps    int // the new counts, when they changed; -1 otherwise
}

func (c change) empty() bool {
	return c.added == 0 && c.removed == 0 && c.changed == 0 && c.rules < 0 && c.slivers < 0 && c.taps < 0
}

// attrs are the change as log attributes.
func (c change) attrs() []any {
	out := []any{"vms_added", c.added, "vms_removed", c.removed, "vms_changed", c.changed}
	if len(c.sample) > 0 {
		out = append(out, "sample", c.sample)
	}
	for _, kv := range []struct {
		k string
		v int
	}{{"rules", c.rules}, {"slivers", c.slivers}, {"taps", c.taps}} {
		if kv.v >= 0 {
			out = append(out, kv.k, kv.v)
		}
	}
	return out
}

// diffDesired says what changed from old to d.
func diffDesired(old, d intent.Desired) change {
	c := change{rules: -1, slivers: -1, taps: -1}
	note := func(what, name string) {
		if len(c.sample) < logSample {
			c.sample = append(c.sample, what+name)
		}
	}
	// By index: a map of the endpoints themselves cost every pass a
	// copy of the host's VMs.
	before := make(map[string]int, len(old.Local))
	for i, l := range old.Local {
		before[l.Name] = i
	}
	for i := range d.Local {
		l := &d.Local[i]
		j, ok := before[l.Name]
		switch {
		case !ok:
			c.added++
			note("+", l.Name)
		case !sameEndpoint(&old.Local[j], l):
			c.changed++
			note("~", l.Name)
		}
		delete(before, l.Name)
	}
	for name := range before {
		c.removed++
		note("-", name)
	}
	if !reflect.DeepEqual(old.Visibility, d.Visibility) || !reflect.DeepEqual(old.ProxyARPFarms, d.ProxyARPFarms) {
		c.rules = len(d.Visibility)
	}
	if !reflect.DeepEqual(old.Slivers, d.Slivers) {
		c.slivers = len(d.Slivers)
	}
	if !reflect.DeepEqual(old.Taps, d.Taps) {
		c.taps = len(d.Taps)
	}
	return c
}

// sample returns at most logSample of names, and how many it left out.
func sample(names []string) (shown []string, more int) {
	if len(names) <= logSample {
		return names, 0
	}
	return names[:logSample], len(names) - logSample
}

// sameEndpoint is reflect.DeepEqual of two endpoints, without reflection
// for the fields every endpoint has.
func sameEndpoint(a, b *intent.LocalEndpoint) bool {
	return a.Name == b.Name && a.IP == b.IP && a.MAC == b.MAC && a.Interface == b.Interface &&
		(a.Firewall == b.Firewall || reflect.DeepEqual(a.Firewall, b.Firewall)) &&
		(a.Egress == b.Egress || reflect.DeepEqual(a.Egress, b.Egress)) &&
		slices.Equal(a.Published, b.Published) && a.Floating == b.Floating
}
