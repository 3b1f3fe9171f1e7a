package e2e

import (
	"slices"
	"strings"
	"testing"
)

// TestPrivilegedLabExecShowsAVMItsOwnSys: tools in a VM that read
// /sys/class/net see the VM's interfaces, not the machine's.
func TestPrivilegedLabExecShowsAVMItsOwnSys(t *testing.T) {
	l := upLab(t, quickstart)
	if got := strings.Fields(l.mustIn("web1", "ls", "/sys/class/net")); strings.Join(got, " ") != "eth0 lo" {
		t.Errorf("web1's /sys/class/net lists %v; want exactly eth0 and lo", got)
	}
	// The MAC in /sys is the VM's own eth0's.
	if got := strings.TrimSpace(l.mustIn("web1", "cat", "/sys/class/net/eth0/address")); got != l.mac("web1", "eth0") {
		t.Errorf("web1's /sys/class/net/eth0/address is %s; its eth0 has %s", got, l.mac("web1", "eth0"))
	}
	if got := strings.Fields(l.mustIn("h1", "ls", "/sys/class/net")); !slices.Contains(got, "uplink0") || !slices.Contains(got, blueWeb1Vif) || slices.Contains(got, "eth0") {
		t.Errorf("h1's /sys/class/net lists %v; want its uplink and vifs, not the VMs' eth0", got)
	}
}
