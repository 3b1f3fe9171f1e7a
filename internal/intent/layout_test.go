package intent

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"sort"
	"testing"
)

// A host's desired state written as keys and assembled back is the same,
// and a farm's rules reach only the hosts carrying that farm.
func TestDesiredSplitIntoKeysAssemblesBackAndFarmsStayApart(t *testing.T) {
	d := Desired{Node: "h1", VMNet: "10.0.0.0/8",
		Local: []LocalEndpoint{{Name: "blue/web/a", IP: "10.1.1.2"}, {Name: "blue/db/b", IP: "10.1.2.2"}},
		Visibility: []VisRule{
			{SrcFarm: 1, SrcSubnet: 1, DstFarm: 1, DstSubnet: 2, Proto: 6, Port: 80},
			{SrcFarm: 1, SrcSubnet: 1, DstFarm: 2, DstSubnet: 1},
		},
		ProxyARPFarms: []uint8{1},
		Slivers:       []LocalSliver{{Name: "s2", Slot: 2}, {Name: "s1", Slot: 1}},
		Taps:          []TapRule{{ID: 7, Policy: "p"}},
	}
	keys, farms, err := Split(d)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 5 || len(farms) != 2 {
		t.Fatalf("%d keys and %d farm states, want 5 and 2", len(keys), len(farms))
	}
	got, err := Assemble("h1", keys, farms)
	if err != nil {
		t.Fatal(err)
	}
	want := d
	want.Slivers = []LocalSliver{{Name: "s1", Slot: 1}, {Name: "s2", Slot: 2}}
	want.Local = []LocalEndpoint{{Name: "blue/web/a", IP: "10.1.1.2"}, {Name: "blue/db/b", IP: "10.1.2.2"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("assembled\n%+v\nwant\n%+v", got, want)
	}
	// A host with a VM of farm 2 only gets the rule that crosses to it,
	// not farm 1's own, nor farm 1's proxy ARP.
	h2 := HostKeys{DesiredVMKey("h2", "red/x/c"): []byte(`{"name":"red/x/c","ip":"10.2.1.2"}`)}
	got2, err := Assemble("h2", h2, farms)
	if err != nil {
		t.Fatal(err)
	}
	if len(got2.Visibility) != 1 || got2.Visibility[0].DstFarm != 2 || len(got2.ProxyARPFarms) != 0 {
		t.Fatalf("h2 (farm 2 only) got rules %+v, proxy ARP %v", got2.Visibility, got2.ProxyARPFarms)
	}
	// A kind of key this version does not know is left alone.
	h2[DesiredHostPrefix("h2")+"vnat/x"] = []byte(`{}`)
	if _, err := Assemble("h2", h2, farms); err != nil {
		t.Fatalf("an unknown kind of key: %v", err)
	}
	if id, ok := ParseFarmStateKey(FarmStateKey(7)); !ok || id != 7 {
		t.Fatalf("farm state key of 7 parses as %d %v", id, ok)
	}
}

// The rules' order is the one fmt.Sprint's text gives, as it always was:
// digests of desired state computed before and after agree.
func TestSortVisRulesKeepsTheOrderOfTheRulesText(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		rules := make([]VisRule, 1+rng.IntN(60))
		for i := range rules {
			rules[i] = VisRule{SrcFarm: uint8(rng.IntN(256)), SrcSubnet: uint8(rng.IntN(12)), DstFarm: uint8(rng.IntN(256)),
				DstSubnet: uint8(rng.IntN(12)), Proto: []uint8{0, 1, 6, 17}[rng.IntN(4)], Port: uint16(rng.IntN(70000))}
			if rng.IntN(4) == 0 && i > 0 {
				rules[i] = rules[i-1] // duplicates too
			}
		}
		for _, r := range rules {
			if got, want := string(appendVisRuleText(nil, r)), fmt.Sprint(r); got != want {
				t.Fatalf("text of %+v: %q, fmt.Sprint gives %q", r, got, want)
			}
		}
		want := append([]VisRule(nil), rules...)
		sort.Slice(want, func(i, j int) bool { return fmt.Sprint(want[i]) < fmt.Sprint(want[j]) })
		SortVisRules(rules)
		if !reflect.DeepEqual(rules, want) {
			t.Fatalf("round %d: SortVisRules gave %v, want %v", round, rules, want)
		}
	}
}

// Every desired key parses back into the host, kind and name it was made
// of, and a key of the layout of before into its host alone.
func TestDesiredKeysParseBackIntoHostKindAndName(t *testing.T) {
	for _, c := range []struct{ key, host, kind, name string }{
		{DesiredVMKey("h1", "blue/web/a"), "h1", DesiredVMKind, "blue/web/a"},
		{DesiredSliverKey("h2", "s1"), "h2", DesiredSliverKind, "s1"},
		{DesiredTapKey("h3", 7), "h3", DesiredTapKind, "0000000007"},
		{DesiredKindPrefix("h4", "vnat") + "x", "h4", "vnat", "x"},
		{DesiredPrefix + "h5", "h5", "", ""},
	} {
		host, kind, name, ok := ParseDesiredKey(c.key)
		if !ok || host != c.host || kind != c.kind || name != c.name {
			t.Errorf("%s parses as %q %q %q %v, want %q %q %q", c.key, host, kind, name, ok, c.host, c.kind, c.name)
		}
	}
	if _, _, _, ok := ParseDesiredKey(FarmStateKey(1)); ok {
		t.Errorf("a farm state key parses as a desired key")
	}
	if got := LISPMappingKey(netip.MustParsePrefix("10.99.0.0/16")); got != LISPMappingsPrefix+"10.99.0.0_16" {
		t.Errorf("mapping key of 10.99.0.0/16: %s", got)
	}
}
