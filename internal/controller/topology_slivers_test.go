package controller

import (
	"fmt"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

func storedSlivers(t *testing.T, s store.Store) string {
	t.Helper()
	list, _, err := store.ListJSON[intent.Sliver](t.Context(), s, intent.SliversPrefix)
	if err != nil {
		t.Fatal(err)
	}
	sortSlivers(list)
	var out []string
	for _, sl := range list {
		out = append(out, fmt.Sprintf("%s#%d=%v", sl.FullName(), sl.Slot, sl.Leases))
	}
	return strings.Join(out, " ")
}

func TestTopologySliversAreSeededThroughTheAPIsChecks(t *testing.T) {
	c, s := newController()
	if err := c.ApplyTopology(t.Context(), parse(t, topo)); err != nil {
		t.Fatal(err)
	}
	seeds := []SliverSeed{
		{Name: "s1", Host: "h1", Ports: "10000-10099", Line: 10},
		{Name: "s2", Host: "h1", Ports: "10100-10199,1:20000-20099", Line: 11},
		{Name: "s3", Host: "h2", Ports: "10000-10099", Line: 12},
	}
	uplinks := map[string]int{"h1": 2, "h2": 1}
	if err := c.applySlivers(t.Context(), "t.yaml", seeds, uplinks); err != nil {
		t.Fatal(err)
	}
	want := "h1/s1#1=[{0 10000 10099}] h1/s2#2=[{0 10100 10199} {1 20000 20099}] h2/s3#1=[{0 10000 10099}]"
	if got := storedSlivers(t, s); got != want {
		t.Fatalf("seeded %s, want %s", got, want)
	}
	// Applied again with s1 gone and s2's leases changed: s2 keeps its slot.
	seeds = []SliverSeed{{Name: "s2", Host: "h1", Ports: "10000-10199", Line: 11}, seeds[2]}
	if err := c.applySlivers(t.Context(), "t.yaml", seeds, uplinks); err != nil {
		t.Fatal(err)
	}
	want = "h1/s2#2=[{0 10000 10199}] h2/s3#1=[{0 10000 10099}]"
	if got := storedSlivers(t, s); got != want {
		t.Fatalf("re-applied %s, want %s", got, want)
	}

	cases := []struct {
		seeds []SliverSeed
		want  string
	}{
		{[]SliverSeed{{Name: "s1", Host: "h1", Ports: "10000-10099", Line: 3}, {Name: "s2", Host: "h1", Ports: "10050", Line: 4}},
			"t.yaml:4: sliver s2: ports: ports 10050 on uplink 0 overlap h1/s1's lease 10000-10099"},
		{[]SliverSeed{{Name: "s1", Host: "h2", Ports: "1:10000", Line: 5}}, "t.yaml:5: sliver s1: ports: lease 1:10000 is on uplink 1, but host h2 has uplinks 0 only"},
		{[]SliverSeed{{Name: "s1", Host: "h1", Ports: "40000", Line: 6}}, "t.yaml:6: sliver s1: ports: ports 40000 on uplink 0 overlap host h1's ephemeral range 32768-60999"},
		{[]SliverSeed{{Name: "s1", Host: "h9", Ports: "10000", Line: 7}}, `t.yaml:7: sliver s1: host: no host "h9"`},
		{[]SliverSeed{{Name: "s1", Host: "h1", Ports: "10-x", Line: 8}}, `t.yaml:8: sliver s1: ports "10-x": lease 1 "10-x": port "x"`},
	}
	for _, tc := range cases {
		c, _ := newController()
		if err := c.ApplyTopology(t.Context(), parse(t, topo)); err != nil {
			t.Fatal(err)
		}
		err := c.applySlivers(t.Context(), "t.yaml", tc.seeds, uplinks)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("seeds %+v: %v, want %q", tc.seeds, err, tc.want)
		}
	}
}
