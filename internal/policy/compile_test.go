package policy

import (
	"reflect"
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

func vm(name, host, ip string) intent.VM {
	return intent.VM{Farm: "blue", Subnet: "web", Name: name, Host: host, Interface: "vif-" + name, IP: ip, MAC: "02:00:" + ip}
}

func TestEachNodeGetsOnlyItsOwnVMs(t *testing.T) {
	s := State{
		Hosts: []intent.Host{{Name: "h1"}, {Name: "h2"}},
		VMs:   []intent.VM{vm("web2", "h2", "10.1.1.3"), vm("web1", "h1", "10.1.1.2"), vm("web3", "h1", "10.1.1.4")},
		Nodes: []intent.Node{{Name: "h1", UplinkMAC: "aa:00:00:00:00:01"}, {Name: "h2", UplinkMAC: "aa:00:00:00:00:02"}},
	}
	d, pending := Compile(s)
	if len(pending) != 0 {
		t.Fatalf("pending %v", pending)
	}
	h1 := d["h1"]
	if got := []string{h1.Local[0].Name, h1.Local[1].Name}; len(h1.Local) != 2 || !reflect.DeepEqual(got, []string{"blue/web/web1", "blue/web/web3"}) {
		t.Fatalf("h1 local %+v", h1.Local)
	}
	if h2 := d["h2"]; len(h2.Local) != 1 || h2.Local[0].Name != "blue/web/web2" {
		t.Fatalf("h2 %+v", h2)
	}
}

func TestVMOnHostWithoutAgentIsPending(t *testing.T) {
	s := State{
		Hosts: []intent.Host{{Name: "h1"}, {Name: "h2"}},
		VMs:   []intent.VM{vm("web1", "h1", "10.1.1.2"), vm("web2", "h2", "10.1.1.3")},
		Nodes: []intent.Node{{Name: "h1", UplinkMAC: "aa:00:00:00:00:01"}},
	}
	_, pending := Compile(s)
	if len(pending) != 1 || pending[0] != "blue/web/web2 (host h2 has no agent yet)" {
		t.Fatalf("pending %v", pending)
	}
}

// Proxy ARP answers a local VM's question, so a host needs the setting of
// the farms its VMs belong to only: another farm's setting changing must
// not reach it.
func TestProxyARPFarmsAreListedForHostsCarryingThem(t *testing.T) {
	red := func(name, host, ip string) intent.VM { v := vm(name, host, ip); v.Farm = "red"; return v }
	s := State{
		Hosts: []intent.Host{{Name: "h1"}, {Name: "h2"}},
		Farms: []intent.Farm{{Name: "red", ID: 2, ProxyARP: true}, {Name: "blue", ID: 1}, {Name: "green", ID: 3, ProxyARP: true}},
		VMs:   []intent.VM{red("r1", "h1", "10.2.1.2"), vm("b1", "h1", "10.1.1.2"), vm("b2", "h2", "10.1.1.3")},
	}
	d, _ := Compile(s)
	if !reflect.DeepEqual(d["h1"].ProxyARPFarms, []uint16{2}) {
		t.Fatalf("h1 (red and blue VMs) proxy ARP farms %v, want [2]", d["h1"].ProxyARPFarms)
	}
	if len(d["h2"].ProxyARPFarms) != 0 {
		t.Fatalf("h2 (blue VMs only) proxy ARP farms %v, want none", d["h2"].ProxyARPFarms)
	}
}

func TestCompileIsDeterministic(t *testing.T) {
	s := State{
		Hosts: []intent.Host{{Name: "h1"}, {Name: "h2"}},
		VMs:   []intent.VM{vm("a", "h1", "10.1.1.2"), vm("b", "h2", "10.1.1.3"), vm("c", "h2", "10.1.1.4")},
		Nodes: []intent.Node{{Name: "h1", UplinkMAC: "m1"}, {Name: "h2", UplinkMAC: "m2"}},
	}
	d1, _ := Compile(s)
	s.VMs[0], s.VMs[2] = s.VMs[2], s.VMs[0]
	d2, _ := Compile(s)
	for h := range d1 {
		if d1[h].Digest() != d2[h].Digest() {
			t.Fatalf("%s: digest depends on input order", h)
		}
	}
}

// A host gets only the rules of farms it has VMs of: another tenant's rules
// would take room in its map and move its epoch for nothing.
func TestAHostGetsOnlyTheRulesOfFarmsWithVMsOnIt(t *testing.T) {
	s := State{
		Hosts: []intent.Host{{Name: "h1"}, {Name: "h2"}, {Name: "h3"}},
		Farms: []intent.Farm{
			{Name: "blue", ID: 1, Peers: []string{"red"}, Rules: []intent.Rule{
				{From: "blue/web", To: "blue/db", Proto: "tcp", Port: 5432},
				{From: "blue/web", To: "red/web", Proto: "tcp", Port: 80},
			}},
			{Name: "red", ID: 2, Peers: []string{"blue"}, Rules: []intent.Rule{
				{From: "red/web", To: "red/db", Proto: "udp", Port: 53},
				{From: "blue/web", To: "red/web", Proto: "tcp", Port: 80},
			}},
			{Name: "green", ID: 3, Rules: []intent.Rule{{From: "green/a", To: "green/b"}}},
		},
		Subnets: []intent.Subnet{
			{Farm: "blue", Name: "web", ID: 1}, {Farm: "blue", Name: "db", ID: 2},
			{Farm: "red", Name: "web", ID: 1}, {Farm: "red", Name: "db", ID: 2},
			{Farm: "green", Name: "a", ID: 1}, {Farm: "green", Name: "b", ID: 2},
		},
		VMs: []intent.VM{vm("web1", "h1", "10.1.1.2"), {Farm: "red", Subnet: "db", Name: "rdb", Host: "h2", IP: "10.2.2.2"}},
	}
	d, _ := Compile(s)
	blueDB := intent.VisRule{SrcFarm: 1, SrcSubnet: 1, DstFarm: 1, DstSubnet: 2, Proto: 6, Port: 5432}
	blueRed := intent.VisRule{SrcFarm: 1, SrcSubnet: 1, DstFarm: 2, DstSubnet: 1, Proto: 6, Port: 80}
	redDB := intent.VisRule{SrcFarm: 2, SrcSubnet: 1, DstFarm: 2, DstSubnet: 2, Proto: 17, Port: 53}
	for host, want := range map[string][]intent.VisRule{
		"h1": {blueDB, blueRed}, // blue only: its rules, and the one into red
		"h2": {blueRed, redDB},  // red only: its rules, and the one from blue
		"h3": {},                // no VM: no rule
	} {
		got := d[host].Visibility
		if got == nil || len(got) != len(want) {
			t.Fatalf("%s gets %+v, want %+v", host, got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s gets %+v, want %+v", host, got, want)
			}
		}
	}
}

func TestEachNodeGetsOnlyItsOwnSliversBySlot(t *testing.T) {
	lease := func(up int, lo, hi uint16) []intent.Lease { return []intent.Lease{{Uplink: up, Lo: lo, Hi: hi}} }
	s := State{
		Hosts: []intent.Host{{Name: "h1"}, {Name: "h2"}, {Name: "h3"}},
		Slivers: []intent.Sliver{
			{Host: "h1", Name: "s2", Slot: 2, Leases: lease(0, 10100, 10199)},
			{Host: "h2", Name: "s9", Slot: 1, Leases: lease(0, 10000, 10099)},
			{Host: "h1", Name: "s1", Slot: 1, Leases: lease(1, 10000, 10099)},
		},
	}
	d, _ := Compile(s)
	want := []intent.LocalSliver{{Name: "s1", Slot: 1, Leases: lease(1, 10000, 10099)}, {Name: "s2", Slot: 2, Leases: lease(0, 10100, 10199)}}
	if got := d["h1"].Slivers; !reflect.DeepEqual(got, want) {
		t.Fatalf("h1 slivers %+v, want %+v", got, want)
	}
	if got := d["h2"].Slivers; len(got) != 1 || got[0].Name != "s9" {
		t.Fatalf("h2 slivers %+v, want only s9", got)
	}
	if got := d["h3"].Slivers; got != nil {
		t.Fatalf("h3 slivers %+v, want none (and none in its JSON)", got)
	}
	// A host's desired state changes with its own slivers only.
	before := d["h2"].Digest()
	s.Slivers[0].Leases = lease(0, 10100, 10150)
	d, _ = Compile(s)
	if d["h2"].Digest() != before {
		t.Fatal("h2's desired state changed with a lease on h1")
	}
}
