package vnat

import (
	"fmt"
	"sort"
	"testing"
)

// xlateDump lists vnat_xlate as "dir: key -> value" lines, sorted.
func xlateDump(t *testing.T, d *Kernel) []string {
	t.Helper()
	var k XlateKey
	var v Rewrite
	var out []string
	it := d.objs.VnatXlate.Iterate()
	for it.Next(&k, &v) {
		out = append(out, fmt.Sprintf("%d: %s -> %s:%d-%s:%d", k.Dir, TupleOfKey(k), addrOf(v.Saddr), portOf(v.Sport), addrOf(v.Daddr), portOf(v.Dport)))
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// A batch that cannot be installed whole leaves nothing of itself: not
// in the table, not in the map, not in the migrated count; a connection
// it would have moved keeps its old translation.
func TestPrivilegedTranslateBatchIsAllOrNothing(t *testing.T) {
	n := newTestNS(t)
	v0 := Virtual{Proto: TCP, Local: ap("10.9.1.2:40000"), Remote: ap("10.9.2.2:5001")}
	p0 := Physical{Proto: TCP, Local: ap("10.9.3.2:40000"), Remote: ap("10.9.2.2:5001")}
	v1 := Virtual{Proto: TCP, Local: ap("10.9.1.2:40001"), Remote: ap("10.9.2.2:5001")}
	p1 := Physical{Proto: TCP, Local: ap("10.9.3.2:40001"), Remote: ap("10.9.2.2:5001")}
	v2 := Virtual{Proto: TCP, Local: ap("10.9.1.2:40002"), Remote: ap("10.9.2.2:5001")}
	p2 := Physical{Proto: TCP, Local: ap("10.9.3.2:40002"), Remote: ap("10.9.2.2:5001")}
	p0moved := Physical{Proto: TCP, Local: ap("10.9.4.2:40000"), Remote: ap("10.9.2.2:5001")}

	for _, c := range []struct {
		name  string
		size  uint32
		batch []Migration
	}{
		{"two connections on one physical tuple", 0, []Migration{{v1, p1}, {v0, p0moved}, {v2, p1}}},
		{"the map is full halfway", 4, []Migration{{v0, p0moved}, {v1, p1}, {v2, p2}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := openIn(t, n, Options{XlateEntries: c.size})
			if err := d.Translate(v0, p0); err != nil {
				t.Fatal(err)
			}
			before := xlateDump(t, d)
			if err := d.TranslateBatch(c.batch); err == nil {
				t.Fatal("the batch was installed")
			}
			if ms := d.Migrations(); len(ms) != 1 || ms[0].Virtual != v0 || ms[0].Physical != p0 {
				t.Errorf("table after the failed batch: %+v, want only %v -> %v", ms, v0, p0)
			}
			if after := xlateDump(t, d); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Errorf("vnat_xlate after the failed batch:\n%v\nwant as before:\n%v", after, before)
			}
			var cfg vnatVnatConfig
			if err := d.objs.VnatState.Lookup(uint32(0), &cfg); err != nil || cfg.Migrated != 1 {
				t.Errorf("migrated count %d (%v), want 1", cfg.Migrated, err)
			}
			// The batch without the culprit goes in whole.
			if err := d.TranslateBatch(c.batch[:2]); err != nil {
				t.Fatalf("the good part of the batch: %v", err)
			}
			if ms := d.Migrations(); len(ms) != 2 {
				t.Errorf("table after the good batch: %+v, want 2 connections", ms)
			}
			if got := len(xlateDump(t, d)); got != 4 {
				t.Errorf("vnat_xlate holds %d entries after the good batch, want 4", got)
			}
		})
	}
}
