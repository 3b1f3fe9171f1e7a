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

func TestProxyARPFarmsAreListedForEveryHost(t *testing.T) {
	s := State{
		Hosts: []intent.Host{{Name: "h1"}, {Name: "h2"}},
		Farms: []intent.Farm{{Name: "red", ID: 2, ProxyARP: true}, {Name: "blue", ID: 1}, {Name: "green", ID: 3, ProxyARP: true}},
	}
	d, _ := Compile(s)
	for _, h := range []string{"h1", "h2"} {
		if !reflect.DeepEqual(d[h].ProxyARPFarms, []uint8{2, 3}) {
			t.Fatalf("%s proxy ARP farms %v", h, d[h].ProxyARPFarms)
		}
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
