package intent

import (
	"encoding/json"
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
		ProxyARPFarms: []uint16{1},
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
			rules[i] = VisRule{SrcFarm: uint16(rng.IntN(256)), SrcSubnet: uint16(rng.IntN(12)), DstFarm: uint16(rng.IntN(256)),
				DstSubnet: uint16(rng.IntN(12)), Proto: []uint8{0, 1, 6, 17}[rng.IntN(4)], Port: uint16(rng.IntN(70000))}
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

// A view keeps its VMs in order as keys come, change and go (issue 20,
// item 18: no longer sorted again on every pass): after every step of a
// long random walk its Desired is what a view made from scratch of the
// same keys gives, its farms are those of its VMs, and a Desired handed
// out before a change is not changed by it.
func TestViewKeepsItsOrderAndFarmsAsKeysChange(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 20))
	v := NewView("h1")
	keys := map[string][]byte{}
	for step := range 3000 {
		i := rng.IntN(300)
		key := DesiredVMKey("h1", fmt.Sprintf("f%d/s/vm%d", i%7, i))
		var before Desired
		if step%50 == 0 {
			before = v.Desired()
		}
		snapshot, _ := json.Marshal(before)
		if rng.IntN(3) == 0 {
			v.Delete(key)
			delete(keys, key)
		} else {
			// The same VM may come back with another address or MAC.
			l := LocalEndpoint{Name: fmt.Sprintf("f%d/s/vm%d", i%7, i), IP: fmt.Sprintf("10.%d.1.%d", 1+rng.IntN(4), 2+rng.IntN(250)),
				MAC: fmt.Sprintf("02:00:00:00:00:%02x", rng.IntN(256)), Interface: fmt.Sprint("vif-vm", i)}
			b, _ := json.Marshal(l)
			if err := v.Set(key, b); err != nil {
				t.Fatal(err)
			}
			keys[key] = b
		}
		fresh := NewView("h1")
		for k, b := range keys {
			if err := fresh.Set(k, b); err != nil {
				t.Fatal(err)
			}
		}
		if got, want := v.Desired(), fresh.Desired(); !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d: the view's desired state\n%+v\nwant (from scratch)\n%+v", step, got.Local, want.Local)
		}
		if got, want := v.Farms(), CarriedFarms(fresh.Desired().Local); !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d: farms %v, want %v", step, got, want)
		}
		if after, _ := json.Marshal(before); string(after) != string(snapshot) {
			t.Fatalf("step %d: a desired state handed out before the change was changed by it", step)
		}
	}
	// Emptied farm by farm, the view carries a farm as long as one VM of
	// it is left.
	for f := 1; f <= 4; f++ {
		for k, b := range keys {
			var l LocalEndpoint
			json.Unmarshal(b, &l)
			if id, _ := FarmOf(l.IP); int(id) == f {
				v.Delete(k)
				delete(keys, k)
			}
		}
		var want []uint16
		for g := f + 1; g <= 4; g++ {
			want = append(want, uint16(g))
		}
		if got := v.Farms(); !reflect.DeepEqual(got, want) {
			t.Fatalf("farms 1 to %d emptied: the view carries %v, want %v", f, got, want)
		}
	}
	if d := v.Desired(); len(d.Local) != 0 || d.Local == nil {
		t.Fatalf("every key deleted: %d VMs (nil list: %v), want an empty list", len(d.Local), d.Local == nil)
	}
}
