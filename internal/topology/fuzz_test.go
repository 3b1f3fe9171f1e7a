package topology

import (
	"net/netip"
	"os"
	"strings"
	"testing"
)

// FuzzParse feeds Parse what an operator might write, starting from every
// topology the tests hold: it must never panic, every error must name a line
// of the file, and a file it accepts must be usable by the lab.
func FuzzParse(f *testing.F) {
	quickstart, err := os.ReadFile("../../examples/quickstart.yaml")
	if err != nil {
		f.Fatal(err)
	}
	portshare, err := os.ReadFile("../../examples/portshare.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{string(quickstart), string(portshare), good, twoFarms, sameNames, shared, vnatTopo} {
		f.Add(s)
	}
	for _, c := range vnatErrorCases {
		f.Add(strings.Replace(vnatTopo, c.old, c.new, 1))
	}
	for _, c := range sliverErrorCases {
		f.Add(strings.Replace(shared, c.old, c.new, 1))
	}
	for _, c := range errorCases {
		f.Add(c.edit(good))
	}
	for _, c := range badRuleCases {
		f.Add(strings.Replace(twoFarms, c.old, c.new, 1))
	}
	for _, c := range duplicateKeyCases {
		f.Add(c.topo)
	}
	for _, s := range malformedCases {
		f.Add(s)
	}
	// TAP policies, to a monitor VM and to a collector on the fabric.
	f.Add(tapsHead + `  - {name: m, sender: blue/web/web1, receiver: any, monitor: blue/ops/mon, proto: tcp, dport: 80}
  - {name: c, sender: red/app/app1, receiver: blue/web, collector: 192.168.100.200, encap: erspan3, cross_farm: true}
`)
	f.Fuzz(func(t *testing.T, data string) {
		top, err := Parse("t.yaml", []byte(data))
		if err != nil {
			checkErrorLines(t, err)
			return
		}
		// What the lab relies on after a successful parse.
		p := top.FabricPrefix()
		if !p.Addr().Is4() || top.Name == "" || top.Datapath == "" || len(top.Hosts) == 0 {
			t.Fatalf("accepted an incomplete topology: %+v", top)
		}
		used := map[string]string{top.Fabric.Controller: "controller"}
		claim := func(who, addr string) {
			if addr == "" || !p.Contains(netip.MustParseAddr(addr)) {
				t.Fatalf("%s has address %q, not one of fabric %s", who, addr, p)
			}
			if other, dup := used[addr]; dup {
				t.Fatalf("%s and %s both have %s", who, other, addr)
			}
			used[addr] = who
		}
		for _, h := range top.Hosts {
			if _, ok := top.HostByName(h.Name); !ok || h.Uplinks < 1 || len(h.UplinkAddrs) != h.Uplinks || h.UplinkAddrs[0] != h.Address {
				t.Fatalf("host %+v has no address or cannot be found", h)
			}
			for k, a := range h.UplinkAddrs {
				claim(h.Name+" "+UplinkName(k), a)
			}
		}
		for _, e := range top.Externals() {
			claim("external "+e.Name, e.Address)
		}
		for _, s := range top.Slivers() {
			h, ok := top.HostByName(s.Host)
			if !ok || len(s.Leases) == 0 {
				t.Fatalf("sliver %+v has no host or no leases", s)
			}
			for _, l := range s.Leases {
				if l.Uplink >= h.Uplinks || l.Lo == 0 || l.Lo > l.Hi {
					t.Fatalf("sliver %+v: lease %+v does not fit host %+v", s, l, h)
				}
			}
		}
		for _, vm := range top.VMs {
			if _, ok := top.HostByName(vm.Host); !ok || vm.Farm() == "" || vm.SubnetName() == "" {
				t.Fatalf("vm %+v is not placed on a host and a subnet", vm)
			}
			// Every VM is one lab node of its own (lab exec, its namespace).
			node := top.VMNode(vm)
			if back, ok := top.VMByNode(node); !ok || back.Line != vm.Line {
				t.Fatalf("vm %+v: node %q finds %+v, %v", vm, node, back, ok)
			}
			if other, dup := used["node "+node]; dup {
				t.Fatalf("vm %+v and %s are both node %q", vm, other, node)
			}
			used["node "+node] = vm.Subnet + "/" + vm.Name
		}
	})
}
