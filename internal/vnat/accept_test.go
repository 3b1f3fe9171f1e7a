package vnat

import (
	"fmt"
	"sort"
	"testing"
)

// Accept writes only the ingress half of a migration (packets arriving at
// the new physical tuple reach the socket, the socket's own still leave
// untranslated) and counts it as migrated so the programs look it up;
// TranslateBatch takes the entry over; Unaccept of a refused connection
// leaves nothing of it.
func TestPrivilegedAcceptWritesOnlyTheIngressHalfUntilTranslated(t *testing.T) {
	n := newTestNS(t)
	d := openIn(t, n, Options{})
	v0 := Virtual{Proto: TCP, Local: ap("10.9.1.2:40000"), Remote: ap("10.9.2.2:5001")}
	p0 := Physical{Proto: TCP, Local: ap("10.9.3.2:40000"), Remote: ap("10.9.2.2:5001")}
	v1 := Virtual{Proto: TCP, Local: ap("10.9.1.2:40001"), Remote: ap("10.9.2.2:5001")}
	p1 := Physical{Proto: TCP, Local: ap("10.9.3.2:40001"), Remote: ap("10.9.2.2:5001")}
	migrated := func() uint32 {
		t.Helper()
		var cfg vnatVnatConfig
		if err := d.objs.VnatState.Lookup(uint32(0), &cfg); err != nil {
			t.Fatal(err)
		}
		return cfg.Migrated
	}
	if err := d.Accept([]Migration{{v0, p0}, {v1, p1}}); err != nil {
		t.Fatal(err)
	}
	e0, _ := Entries(v0, p0)
	e1, _ := Entries(v1, p1)
	want := []string{
		fmt.Sprintf("%d: %s -> %s:%d-%s:%d", Ingress, TupleOfKey(e0[1].Key), addrOf(e0[1].Value.Saddr), portOf(e0[1].Value.Sport), addrOf(e0[1].Value.Daddr), portOf(e0[1].Value.Dport)),
		fmt.Sprintf("%d: %s -> %s:%d-%s:%d", Ingress, TupleOfKey(e1[1].Key), addrOf(e1[1].Value.Saddr), portOf(e1[1].Value.Sport), addrOf(e1[1].Value.Daddr), portOf(e1[1].Value.Dport)),
	}
	if got := xlateDump(t, d); fmt.Sprint(got) != fmt.Sprint(sorted(want)) {
		t.Fatalf("vnat_xlate after Accept:\n%v\nwant only the ingress halves:\n%v", got, sorted(want))
	}
	if m := migrated(); m != 2 {
		t.Fatalf("migrated count %d after accepting 2, want 2 (the programs skip lookups at 0)", m)
	}
	// The peer took v0 and refused v1.
	if err := d.TranslateBatch([]Migration{{v0, p0}}); err != nil {
		t.Fatal(err)
	}
	if err := d.Unaccept([]Virtual{v0, v1}); err != nil {
		t.Fatal(err)
	}
	if got := xlateDump(t, d); len(got) != 2 {
		t.Fatalf("vnat_xlate after translating v0 and withdrawing v1: %v, want v0's two entries", got)
	}
	for _, e := range e0 {
		var r Rewrite
		if err := d.objs.VnatXlate.Lookup(e.Key, &r); err != nil || r != e.Value {
			t.Errorf("v0's entry %v: %v, %v; want %v", e.Key, r, err, e.Value)
		}
	}
	if err := d.objs.VnatXlate.Lookup(e1[1].Key, new(Rewrite)); err == nil {
		t.Errorf("v1's accepted entry is still there after Unaccept")
	}
	if m := migrated(); m != 1 {
		t.Errorf("migrated count %d, want 1", m)
	}
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}
