package lispdp

import (
	"net/netip"
	"testing"
)

func slotCounts(e lispLispEid) map[uint8]int {
	n := map[uint8]int{}
	for _, id := range e.Slots[:e.Nslots] {
		n[id]++
	}
	return n
}

func TestEIDEntrySharesSlotsByWeightAmongTheBestPriority(t *testing.T) {
	for _, tc := range []struct {
		name   string
		paths  []PathChoice
		slots  map[uint8]int
		usable []uint8
	}{
		{"equal weights", []PathChoice{{1, 1, 50}, {2, 1, 50}}, map[uint8]int{1: 16, 2: 16}, []uint8{1, 2}},
		{"3 to 1", []PathChoice{{1, 1, 75}, {2, 1, 25}}, map[uint8]int{1: 24, 2: 8}, []uint8{1, 2}},
		{"a tiny weight still gets a slot", []PathChoice{{1, 1, 1}, {2, 1, 99}}, map[uint8]int{1: 1, 2: 31}, []uint8{1, 2}},
		{"all weights 0: equal", []PathChoice{{4, 1, 0}, {5, 1, 0}, {6, 1, 0}}, map[uint8]int{4: 11, 5: 11, 6: 10}, []uint8{4, 5, 6}},
		{"weight 0 beside others: none", []PathChoice{{1, 1, 0}, {2, 1, 10}}, map[uint8]int{2: 32}, []uint8{1, 2}},
		{"only the best priority carries; the backup stays usable for pins", []PathChoice{{1, 2, 50}, {2, 1, 50}}, map[uint8]int{2: 32}, []uint8{1, 2}},
		{"priority 255 is unusable, even for pins", []PathChoice{{1, 255, 50}, {200, 1, 50}}, map[uint8]int{200: 32}, []uint8{200}},
		{"nothing usable: no slots", []PathChoice{{1, 255, 50}}, map[uint8]int{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := eidEntry(tc.paths)
			if err != nil {
				t.Fatal(err)
			}
			got := slotCounts(e)
			if len(got) != len(tc.slots) {
				t.Errorf("slots %v, want %v", got, tc.slots)
			}
			for id, n := range tc.slots {
				if got[id] != n {
					t.Errorf("slots %v, want %v", got, tc.slots)
				}
			}
			var usable []uint8
			for id := range MaxPaths {
				if e.Usable[id/64]&(1<<(id%64)) != 0 {
					usable = append(usable, uint8(id))
				}
			}
			if len(usable) != len(tc.usable) {
				t.Fatalf("usable %v, want %v", usable, tc.usable)
			}
			for i := range usable {
				if usable[i] != tc.usable[i] {
					t.Fatalf("usable %v, want %v", usable, tc.usable)
				}
			}
		})
	}
}

// Every path a mapping lists is a member, whatever its priority: its remote
// RLOC may send from the prefix, though 255 says not to send to it.
func TestEIDEntryListsEveryPathAsAMember(t *testing.T) {
	e, err := eidEntry([]PathChoice{{3, 1, 50}, {7, 255, 0}, {9, 2, 10}})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Members[:e.Nmembers]; string(got) != string([]uint8{3, 7, 9}) {
		t.Fatalf("members %v, want [3 7 9]", got)
	}
	if neg, _ := eidEntry(nil); neg.Nmembers != 0 {
		t.Fatalf("a negative mapping has %d members", neg.Nmembers)
	}
}

func TestEIDEntryNegativeAndRefusals(t *testing.T) {
	e, err := eidEntry(nil)
	if err != nil || e.Flags != uint8(lispLispEidFlagLISP_EID_NEGATIVE) {
		t.Errorf("no paths: %+v, %v; want a negative entry", e, err)
	}
	if _, err := eidEntry([]PathChoice{{1, 1, 1}, {1, 2, 1}}); err == nil {
		t.Error("a path listed twice was taken")
	}
	many := make([]PathChoice, Slots+1)
	for i := range many {
		many[i] = PathChoice{ID: uint8(i + 1), Priority: 1, Weight: 1}
	}
	if _, err := eidEntry(many); err == nil {
		t.Errorf("%d paths were taken; at most %d fit the members decapsulation checks", len(many), Slots)
	}
	if _, err := eidKey(netip.MustParsePrefix("2001:db8::/32")); err == nil {
		t.Error("an IPv6 EID prefix was taken")
	}
	k, err := eidKey(netip.MustParsePrefix("10.2.3.4/16"))
	if err != nil || k.Prefixlen != 16 || k.Addr != be32(netip.MustParseAddr("10.2.0.0")) {
		t.Errorf("key %+v, %v: want 10.2.0.0/16", k, err)
	}
}

func TestPathEntryRefusesWhatCannotBeSent(t *testing.T) {
	ok := path1
	if _, err := pathEntry(ok); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*Path){
		"no interface":             func(p *Path) { p.Ifindex = 0 },
		"IPv6 local RLOC":          func(p *Path) { p.LocalRLOC = netip.MustParseAddr("2001:db8::1") },
		"no remote RLOC":           func(p *Path) { p.RemoteRLOC = netip.Addr{} },
		"short MAC":                func(p *Path) { p.DstMAC = p.DstMAC[:5] },
		"instance id of 25 bits":   func(p *Path) { p.InstanceID, p.UseInstanceID = 1<<24, true },
		"MTU below IPv4's 68 + 36": func(p *Path) { p.MTU = 100 },
	} {
		p := ok
		mutate(&p)
		if _, err := pathEntry(p); err == nil {
			t.Errorf("%s: taken", name)
		}
	}
}
