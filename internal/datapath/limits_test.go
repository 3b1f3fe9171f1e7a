package datapath

import (
	"errors"
	"testing"

	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/limits"
	"github.com/onehop/onehop/internal/policy"
)

// internal/limits is what the controller checks intent against; it must
// say what the compiled programs hold.
func TestLimitsAreTheProgramsMapSizes(t *testing.T) {
	spec, err := loadVif()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{
		"endpoints":      limits.MaxVMsPerHost,
		"vifs":           limits.MaxVMsPerHost,
		"vm_shares":      limits.MaxVMsPerHost,
		"firewalls":      2 * limits.MaxVMsPerHost, // two rule generations
		"firewall_rules": 2 * limits.MaxVMsPerHost * limits.MaxFirewallRules * 2,
		"visibility":     2 * limits.MaxVisibilityRules,
		"conntrack":      limits.MaxFlows,
		"mappings":       limits.DefaultMappingTableSize,
		"scopes":         limits.MaxScopes,
		"scope_members":  limits.MaxScopeMembers,
	} {
		m, ok := spec.Maps[name]
		if !ok {
			t.Errorf("no map %s in the vif program", name)
			continue
		}
		if int(m.MaxEntries) != want {
			t.Errorf("map %s holds %d entries, internal/limits says %d", name, m.MaxEntries, want)
		}
	}
	if policy.MaxFirewallRules != limits.MaxFirewallRules {
		t.Errorf("policy checks %d firewall rules, the datapath walks %d", policy.MaxFirewallRules, limits.MaxFirewallRules)
	}
}

// A plan that does not fit is refused whole: the maps keep the rules they
// had, and the error names the map and how many entries did not fit.
func TestPrivilegedAFullMapIsAnErrorAndNothingIsWritten(t *testing.T) {
	k := loadTestKernel(t)
	before, err := k.readPolicy()
	if err != nil {
		t.Fatal(err)
	}
	e := compiled(t, testDesired())
	for port := 1; port <= limits.MaxVisibilityRules; port++ {
		e.Visibility[VisKey{SrcFarm: 3, SrcSubnet: 1, DstFarm: 3, DstSubnet: 2, Proto: 6, Port: uint16(port)}] = 1
	}
	err = k.Apply(e, "")
	var oe *feature.OverflowError
	if !errors.As(err, &oe) || len(oe.Overflows) != 1 {
		t.Fatalf("apply of %d visibility rules: %v, want an overflow of the visibility map", len(e.Visibility), err)
	}
	o := oe.Overflows[0]
	if o.Map != "visibility" || o.Want != len(e.Visibility) || o.Capacity != limits.MaxVisibilityRules {
		t.Fatalf("overflow %+v, want visibility: %d wanted, capacity %d", o, len(e.Visibility), limits.MaxVisibilityRules)
	}
	after, err := k.readPolicy()
	if err != nil {
		t.Fatal(err)
	}
	if !after[0].equal(before[0]) || !after[1].equal(before[1]) {
		t.Fatal("an apply refused for a full map wrote rules anyway")
	}
}
