package topology

import (
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
	for _, s := range []string{string(quickstart), good, twoFarms} {
		f.Add(s)
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
		for _, h := range top.Hosts {
			if _, ok := top.HostByName(h.Name); !ok || h.Address == "" {
				t.Fatalf("host %+v has no address or cannot be found", h)
			}
		}
		for _, vm := range top.VMs {
			if _, ok := top.HostByName(vm.Host); !ok || vm.Farm() == "" || vm.SubnetName() == "" {
				t.Fatalf("vm %+v is not placed on a host and a subnet", vm)
			}
		}
	})
}
