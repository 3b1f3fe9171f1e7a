package lab

import (
	"strings"
	"testing"
)

// TestAgentsRelayLocationsOnlyInLabsWithVNATVMs: hosts relay their VMs'
// VNAT location streams to the controller (docs/vnat-location.md) in a lab
// with vnat: true VMs, and in no other: there a VM reaches no service on
// its host at all.
func TestAgentsRelayLocationsOnlyInLabsWithVNATVMs(t *testing.T) {
	const base = `name: t
hosts: [{name: h1}]
farms: [{name: blue, subnets: [{name: web}]}]
`
	st := &State{Name: "t", Dir: "/run/onehop/t", EtcdURL: "http://192.168.100.1:2379", BPFFS: "/run/onehop/t/bpffs"}
	with := strings.Join(agentArgs(st, parse(t, base+"vms: [{name: web1, host: h1, subnet: blue/web, vnat: true}]\n"), "h1"), " ")
	if !strings.Contains(with, "--location-server 192.168.100.1") {
		t.Errorf("agent args with a VNAT VM %q lack --location-server 192.168.100.1", with)
	}
	without := strings.Join(agentArgs(st, parse(t, base+"vms: [{name: web1, host: h1, subnet: blue/web}]\nexternals: [{name: inet, vnat: true}]\n"), "h1"), " ")
	if strings.Contains(without, "--location-server") {
		t.Errorf("agent args without a VNAT VM %q have --location-server", without)
	}
}
