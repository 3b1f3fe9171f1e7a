package tap

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/limits"
)

// The node h1 of these tests: web1 (10.1.1.2) and mon1 (10.1.1.9) live
// here; web2 (10.1.1.3), db1 (10.1.2.2) and mon2 (10.1.1.10) on h2.
var (
	web1 = netip.MustParseAddr("10.1.1.2")
	web2 = netip.MustParseAddr("10.1.1.3")
	db1  = netip.MustParseAddr("10.1.2.2")
	mon1 = netip.MustParseAddr("10.1.1.9")
	mon2 = netip.MustParseAddr("10.1.1.10")
	mon3 = netip.MustParseAddr("10.1.1.11") // on h3, which has not reported
)

func vm(a netip.Addr) intent.TapEnd { return intent.TapEnd{Kind: "vm", IP: a.String()} }
func subnet(f, s uint16) intent.TapEnd {
	return intent.TapEnd{Kind: "subnet", Farm: f, Subnet: s}
}

// anyEnd is "any" VM of farm 1, the farm the tests' VMs are in ("any"
// never reaches past a farm).
var anyEnd = intent.TapEnd{Kind: "any", Farm: 1}

func rule(id uint32, s, r intent.TapEnd, mon netip.Addr, host string) intent.TapRule {
	return intent.TapRule{ID: id, Policy: fmt.Sprintf("p%d", id), Sender: s, Receiver: r, MonitorIP: mon.String(), MonitorHost: host}
}

func node(taps ...intent.TapRule) feature.Node {
	local := func(name string, a netip.Addr) intent.LocalEndpoint {
		return intent.LocalEndpoint{Name: "blue/web/" + name, IP: a.String(), Interface: "vif-" + name}
	}
	return feature.Node{
		Name: "h1",
		Desired: intent.Desired{Node: "h1", Local: []intent.LocalEndpoint{local("web1", web1), local("mon1", mon1)},
			Taps: taps},
		Nodes: []intent.Node{{Name: "h1", UplinkMAC: "aa:00:00:00:00:01"}, {Name: "h2", UplinkMAC: "aa:00:00:00:00:02"}},
		Ifindex: func(name string) (int, error) {
			switch name {
			case "vif-web1":
				return 1, nil
			case "vif-mon1":
				return 31, nil
			}
			return 0, os.ErrNotExist
		},
	}
}

// summary is a plan in one line a table can say: copy rules as
// id>target, recover rules as id<ifindex, missing as id?.
func summary(p Plan) string {
	var parts []string
	for _, c := range p.Copy {
		if c.MonitorIfindex != 0 {
			parts = append(parts, fmt.Sprintf("%d>vif%d", c.ID, c.MonitorIfindex))
		} else {
			parts = append(parts, fmt.Sprintf("%d>%s", c.ID, c.MonitorHostMAC))
		}
	}
	for _, r := range p.Recover {
		parts = append(parts, fmt.Sprintf("%d<vif%d", r.ID, r.MonitorIfindex))
	}
	for _, m := range p.Missing {
		parts = append(parts, fmt.Sprintf("%d?", m.ID))
	}
	return strings.Join(parts, " ")
}

func TestCompileCopiesWhatALocalVMMaySendAndRecoversForLocalMonitors(t *testing.T) {
	vlan := func(r intent.TapRule, v uint16) intent.TapRule { r.VLAN = v; return r }
	for _, c := range []struct {
		name string
		taps []intent.TapRule
		want string
		use  bool
	}{
		{"no rules", nil, "", false},
		{"local sender, local monitor: copy and recover", []intent.TapRule{rule(1, vm(web1), vm(web2), mon1, "h1")}, "1>vif31 1<vif31", true},
		{"local sender, remote monitor: copy to its host", []intent.TapRule{rule(2, vm(web1), vm(web2), mon2, "h2")}, "2>aa:00:00:00:00:02", true},
		{"remote sender, local monitor: recover only", []intent.TapRule{rule(3, vm(web2), vm(db1), mon1, "h1")}, "3<vif31", true},
		{"remote sender, remote monitor: nothing here", []intent.TapRule{rule(4, vm(web2), vm(db1), mon2, "h2")}, "", false},
		{"a subnet with a local VM sends", []intent.TapRule{rule(5, subnet(1, 1), anyEnd, mon2, "h2")}, "5>aa:00:00:00:00:02", true},
		{"a subnet without one does not", []intent.TapRule{rule(6, subnet(1, 2), anyEnd, mon2, "h2")}, "", false},
		{"any sender has local VMs", []intent.TapRule{rule(7, anyEnd, anyEnd, mon2, "h2")}, "7>aa:00:00:00:00:02", true},
		{"any of another farm has none here", []intent.TapRule{rule(14, intent.TapEnd{Kind: "any", Farm: 2}, anyEnd, mon2, "h2")}, "", false},
		{"a VLAN no local VM is on", []intent.TapRule{vlan(rule(8, anyEnd, anyEnd, mon2, "h2"), 1*256+2)}, "", false},
		{"a VLAN a local VM is on", []intent.TapRule{vlan(rule(9, anyEnd, anyEnd, mon2, "h2"), 1*256+1)}, "9>aa:00:00:00:00:02", true},
		{"monitor host not reported yet", []intent.TapRule{rule(10, vm(web1), vm(web2), mon3, "h3")}, "10?", false},
		{"monitor placed here but not among the VMs yet", []intent.TapRule{rule(11, vm(web1), vm(web2), mon3, "h1")}, "11?", false},
		{"rules sorted by ID, the missing one left out alone", []intent.TapRule{
			rule(13, vm(web1), vm(web2), mon3, "h3"), rule(12, vm(web1), anyEnd, mon2, "h2")}, "12>aa:00:00:00:00:02 13?", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := Compile(node(c.taps...))
			if err != nil {
				t.Fatal(err)
			}
			if got := summary(p); got != c.want {
				t.Errorf("plan %q, want %q", got, c.want)
			}
			if p.InUse() != c.use {
				t.Errorf("in use %v, want %v", p.InUse(), c.use)
			}
		})
	}
}

func TestCompileWaitsForAMonitorsVif(t *testing.T) {
	n := node(rule(1, vm(web1), vm(web2), mon1, "h1"))
	n.Ifindex = func(string) (int, error) { return 0, os.ErrNotExist }
	p, err := Compile(n)
	if err != nil {
		t.Fatal(err)
	}
	if got := summary(p); got != "1?" || !strings.Contains(p.Missing[0].Why, "vif-mon1") {
		t.Fatalf("plan %q (%+v), want rule 1 missing for its vif", got, p.Missing)
	}
}

func TestCompileRefusesWhatTheControllerNeverWrites(t *testing.T) {
	ports := func(r intent.TapRule, lo, hi uint16) intent.TapRule { r.DportLo, r.DportHi = lo, hi; return r }
	for name, c := range map[string]struct {
		taps []intent.TapRule
		want string
	}{
		"unknown kind":    {[]intent.TapRule{rule(1, intent.TapEnd{Kind: "farm"}, anyEnd, mon1, "h1")}, `sender: kind "farm"`},
		"bad vm address":  {[]intent.TapRule{rule(1, anyEnd, intent.TapEnd{Kind: "vm", IP: "x"}, mon1, "h1")}, `receiver: vm address "x"`},
		"ports backwards": {[]intent.TapRule{ports(rule(1, anyEnd, anyEnd, mon1, "h1"), 90, 80)}, "destination ports 90-80"},
		"two of one id":   {[]intent.TapRule{rule(1, anyEnd, anyEnd, mon1, "h1"), rule(1, anyEnd, anyEnd, mon2, "h2")}, "listed twice"},
		"id 0":            {[]intent.TapRule{rule(0, anyEnd, anyEnd, mon1, "h1")}, "ID 0"},
		"bad monitor":     {[]intent.TapRule{{ID: 1, Sender: anyEnd, Receiver: anyEnd, MonitorIP: "10.1.1"}}, "monitor address"},
	} {
		_, err := Compile(node(c.taps...))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "node h1") {
			t.Errorf("%s: error %v, want one naming the node and %q", name, err, c.want)
		}
	}
}

// The index keys a plan lays out, as strings: role/side/kind/addr -> ids.
func indexOf(t *testing.T, p Plan) map[string]string {
	t.Helper()
	l, err := layoutOf(p)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for k, ids := range l.index {
		role := map[uint8]string{roleCopy: "copy", roleRecover: "recover"}[k.role]
		side := map[uint8]string{sideSender: "sender", sideRecv: "receiver"}[k.side]
		kind := map[uint8]string{kindIP: "ip", kindSegment: "segment", kindAny: "any"}[k.kind]
		out[fmt.Sprintf("%s/%s/%s/%s", role, side, kind, k.addr)] = fmt.Sprint(ids)
	}
	return out
}

func TestLayoutIndexesSendersExactlyAndFoldsTheVLANIn(t *testing.T) {
	vlan := func(r intent.TapRule, v uint16) intent.TapRule { r.VLAN = v; return r }
	p, err := Compile(node(
		rule(1, vm(web1), vm(web2), mon2, "h2"),              // web1 only
		rule(2, subnet(1, 1), subnet(1, 2), mon1, "h1"),      // web1 and mon1; recovered too
		vlan(rule(3, anyEnd, anyEnd, mon1, "h1"), 1*256+1),   // segment 1.1: both local VMs; recovered by segment
		vlan(rule(4, vm(web2), anyEnd, mon1, "h1"), 1*256+2), // web2 is not on segment 1.2: never matches
	))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"copy/sender/ip/10.1.1.2":          "[1 2 3]",
		"copy/sender/ip/10.1.1.9":          "[2 3]",
		"copy/receiver/ip/10.1.1.3":        "[1]",
		"copy/receiver/segment/0.1.2.0":    "[2]",
		"copy/receiver/any/0.1.0.0":        "[3]",
		"recover/sender/segment/0.1.1.0":   "[2 3]",
		"recover/receiver/segment/0.1.2.0": "[2]",
		"recover/receiver/any/0.1.0.0":     "[3 4]",
	}
	got := indexOf(t, p)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("index\n got %v\nwant %v", got, want)
	}
	s := p.Sizes()
	if s[MapRules] != 4 || s[MapTargets] != 2 || s[MapIndex] != len(want) || s[MapConfig] != 1 {
		t.Errorf("sizes %v", s)
	}
}

func TestLimitsMatchTheDatapath(t *testing.T) {
	sizes, err := datapath.MapSizes()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{MapRules: limits.MaxTapRules, MapStats: limits.MaxTapRules, MapTargets: limits.MaxTapTargets, MapBuckets: limits.MaxTapTargets, MapConfig: 1} {
		if sizes[name] != want {
			t.Errorf("map %s has %d entries, want %d", name, sizes[name], want)
		}
	}
}

func TestEveryMapOfTheCIsDeclared(t *testing.T) {
	names, err := datapath.MapNames()
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{}
	for _, m := range New(nil).Maps() {
		declared[m.Name] = true
	}
	if err := feature.Check([]feature.Feature{New(nil)}); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, "tap_") && !declared[n] {
			t.Errorf("map %s is not declared by the feature", n)
		}
		delete(declared, n)
	}
	if len(declared) != 0 {
		t.Errorf("declared but not in the programs: %v", declared)
	}
}

func TestSyncOfAnEmptyPlanWithoutADatapathIsANoOp(t *testing.T) {
	f := New(nil)
	if err := f.Sync(Plan{}); err != nil {
		t.Fatal(err)
	}
	p, err := Compile(node(rule(1, vm(web1), vm(web2), mon1, "h1")))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(p); err == nil {
		t.Fatal("a plan in use synced to no datapath")
	}
	var st intent.AgentStatus
	f.Report(&st)
	if st.Taps != nil {
		t.Fatalf("stats %v from no datapath", st.Taps)
	}
}

// Rules and monitors get their slots one way: a key keeps the slot it had,
// a new key takes the lowest free one in order, a key that is gone frees
// its slot, and more keys than slots is refused.
func TestAllocateKeepsSlotsAndGivesTheLowestFree(t *testing.T) {
	had := map[string]uint32{"a": 0, "b": 2, "gone": 1}
	slotOf, taken, freed, ok := allocate([]string{"c", "b", "d", "a"}, had, 5)
	if !ok {
		t.Fatal("refused 4 keys for 5 slots")
	}
	want := map[string]uint32{"a": 0, "b": 2, "c": 1, "d": 3}
	if fmt.Sprint(slotOf) != fmt.Sprint(want) {
		t.Errorf("slots %v, want %v", slotOf, want)
	}
	if fmt.Sprint(taken) != "[1 3]" || fmt.Sprint(freed) != "[1]" {
		t.Errorf("taken %v, freed %v; want [1 3] and [1] (gone's slot, given to c)", taken, freed)
	}
	if _, _, _, ok := allocate([]string{"a", "b", "c"}, nil, 2); ok {
		t.Error("3 keys fit in 2 slots")
	}
	if s, taken, _, ok := allocate([]string{"a", "b"}, nil, 2); !ok || s["a"] != 0 || s["b"] != 1 || len(taken) != 2 {
		t.Errorf("2 new keys in 2 slots: %v %v %v", s, taken, ok)
	}
}
