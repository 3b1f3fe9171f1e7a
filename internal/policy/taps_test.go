package policy

import (
	"fmt"
	"net/netip"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

// tapState: farm blue (id 1), subnets web (1) and ops (2); farm red (id
// 2), subnet app (1), not peered. web1 on h1, web2 on h2, mon on h3, app1
// on h4 (red); h5 holds nothing.
func tapState(taps ...intent.TapPolicy) State {
	vm := func(farm, subnet, name, host, ip string) intent.VM {
		return intent.NewVM(farm, subnet, name, host, netip.MustParseAddr(ip))
	}
	return State{
		Hosts:   []intent.Host{{Name: "h1"}, {Name: "h2"}, {Name: "h3"}, {Name: "h4"}, {Name: "h5"}},
		Farms:   []intent.Farm{{Name: "blue", ID: 1}, {Name: "red", ID: 2}},
		Subnets: []intent.Subnet{{Farm: "blue", Name: "web", ID: 1}, {Farm: "blue", Name: "ops", ID: 2}, {Farm: "red", Name: "app", ID: 1}},
		VMs: []intent.VM{
			vm("blue", "web", "web1", "h1", "10.1.1.2"), vm("blue", "web", "web2", "h2", "10.1.1.3"),
			vm("blue", "ops", "mon", "h3", "10.1.2.2"), vm("red", "app", "app1", "h4", "10.2.1.2"),
		},
		Taps: taps,
	}
}

// tapsByHost is each host's rules as "ID:policy>monitorHost", by host.
func tapsByHost(d map[string]intent.Desired) string {
	hosts := make([]string, 0, len(d))
	for h := range d {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	var out []string
	for _, h := range hosts {
		var rs []string
		for _, r := range d[h].Taps {
			id := fmt.Sprint(r.ID)
			if r.ID&intent.TapReverse != 0 {
				id = fmt.Sprintf("%d'", r.ID&^intent.TapReverse)
			}
			rs = append(rs, id+":"+r.Policy+">"+r.MonitorHost)
		}
		out = append(out, h+"="+strings.Join(rs, ","))
	}
	return strings.Join(out, " ")
}

func TestEachHostGetsExactlyTheTapRulesItPlaysAPartIn(t *testing.T) {
	s := tapState(
		// web1 → anything of blue: h1 is its sender's edge, h3 the monitor's.
		intent.TapPolicy{Name: "one", ID: 1, Sender: "blue/web/web1", Receiver: "any", Monitor: "blue/ops/mon"},
		// Within the web subnet, both ways: every host with a web VM is a
		// sender's edge of both rules; the monitor's host of both too.
		intent.TapPolicy{Name: "two", ID: 2, Sender: "blue/web", Receiver: "blue/web", Monitor: "blue/ops/mon", BothDirections: true},
		// any → web2: any is blue only (the monitor's farm), so h4 (red's
		// app1) is not a sender's edge.
		intent.TapPolicy{Name: "three", ID: 3, Sender: "any", Receiver: "blue/web/web2", Monitor: "blue/ops/mon"},
	)
	d, _ := Compile(s)
	want := "h1=1:one>h3,2:two>h3,3:three>h3,2':two>h3 h2=2:two>h3,3:three>h3,2':two>h3 h3=1:one>h3,2:two>h3,3:three>h3,2':two>h3 h4= h5="
	if got := tapsByHost(d); got != want {
		t.Fatalf("rules by host\n got %s\nwant %s", got, want)
	}
	r := d["h1"].Taps[0]
	if r.MonitorIP != "10.1.2.2" || r.Sender != (intent.TapEnd{Kind: "vm", IP: "10.1.1.2"}) || r.Receiver != (intent.TapEnd{Kind: "any", Farm: 1}) {
		t.Fatalf("rule one: %+v", r)
	}
	// Deterministic: the same intent in another order gives the same bytes.
	s2 := tapState(s.Taps[2], s.Taps[0], s.Taps[1])
	s2.VMs = append([]intent.VM{s.VMs[3], s.VMs[2]}, s.VMs[:2]...)
	d2, _ := Compile(s2)
	for h := range d {
		if d[h].Digest() != d2[h].Digest() {
			t.Fatalf("host %s: digest differs with intent in another order", h)
		}
	}
}

func TestDeletedTapPolicyLeavesNoRuleAnywhere(t *testing.T) {
	p := intent.TapPolicy{Name: "one", ID: 1, Sender: "any", Receiver: "any", Monitor: "blue/ops/mon", BothDirections: true}
	d, _ := Compile(tapState(p))
	if got := tapsByHost(d); !strings.Contains(got, "h1=1:one>h3,1':one>h3") {
		t.Fatalf("with the policy: %s", got)
	}
	d, _ = Compile(tapState())
	for h, hd := range d {
		if len(hd.Taps) != 0 {
			t.Fatalf("host %s still has %+v after the policy was deleted", h, hd.Taps)
		}
	}
}

func TestMovingMonitorSenderOrReceiverRecompilesTheRightHosts(t *testing.T) {
	p := intent.TapPolicy{Name: "one", ID: 1, Sender: "blue/web/web1", Receiver: "blue/web/web2", Monitor: "blue/ops/mon"}
	move := func(s State, vm, host string) State {
		for i := range s.VMs {
			if s.VMs[i].Name == vm {
				s.VMs[i].Host = host
			}
		}
		return s
	}
	cases := []struct {
		name string
		s    State
		want string
	}{
		{"before", tapState(p), "h1=1:one>h3 h2= h3=1:one>h3 h4= h5="},
		// The monitor moves to h5: the sender's edge sends copies there now.
		{"monitor to h5", move(tapState(p), "mon", "h5"), "h1=1:one>h5 h2= h3= h4= h5=1:one>h5"},
		// The sender moves to h2: h2 is its edge, h1 has nothing left.
		{"sender to h2", move(tapState(p), "web1", "h2"), "h1= h2=1:one>h3 h3=1:one>h3 h4= h5="},
		// The receiver moves: nothing changes (copies are made at the sender).
		{"receiver to h4", move(tapState(p), "web2", "h4"), "h1=1:one>h3 h2= h3=1:one>h3 h4= h5="},
		// Sender and monitor on one host: one rule there.
		{"monitor to h1", move(tapState(p), "mon", "h1"), "h1=1:one>h1 h2= h3= h4= h5="},
	}
	for _, tc := range cases {
		d, _ := Compile(tc.s)
		if got := tapsByHost(d); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
	// Addresses follow the VM, not the host: the rule's IPs stay.
	d1, _ := Compile(tapState(p))
	d2, _ := Compile(move(tapState(p), "mon", "h5"))
	a, b := d1["h1"].Taps[0], d2["h1"].Taps[0]
	b.MonitorHost = a.MonitorHost
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("a move changed more than the monitor's host: %+v vs %+v", a, b)
	}
}

func TestTapPolicyThatCannotBeEnforcedCompilesToNothing(t *testing.T) {
	// red's app1 sends, a blue monitor: no cross-farm, and the farms do not
	// peer. The controller refuses it; if such a record is there anyway
	// (a peering withdrawn since), no host copies anything.
	p := intent.TapPolicy{Name: "x", ID: 1, Sender: "red/app/app1", Receiver: "any", Monitor: "blue/ops/mon", CrossFarm: true}
	d, _ := Compile(tapState(p))
	if got := tapsByHost(d); got != "h1= h2= h3= h4= h5=" {
		t.Fatalf("unenforceable policy compiled to %s", got)
	}
	// A VM it names deleted: the same.
	s := tapState(intent.TapPolicy{Name: "y", ID: 2, Sender: "blue/web/web1", Receiver: "any", Monitor: "blue/ops/mon"})
	s.VMs = s.VMs[1:]
	d, _ = Compile(s)
	if got := tapsByHost(d); got != "h1= h2= h3= h4= h5=" {
		t.Fatalf("policy of a deleted VM compiled to %s", got)
	}
}
