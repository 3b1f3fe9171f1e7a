package e2e

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
)

// scaleVMs VMs of blue/web on h1, more than the 32 one subnet could have on
// a host before, when the 33rd stopped h1's whole datapath, other tenants
// included.
const scaleVMs = 34

func scaleTopology() string {
	var b strings.Builder
	b.WriteString(`name: %s
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}]
  - name: red
    subnets: [{name: web}]
vms:
  - {name: far1, host: h2, subnet: blue/web}
  - {name: red1, host: h1, subnet: red/web}
  - {name: red2, host: h2, subnet: red/web}
`)
	for i := 1; i <= scaleVMs; i++ {
		fmt.Fprintf(&b, "  - {name: w%02d, host: h1, subnet: blue/web}\n", i)
	}
	return b.String()
}

func TestPrivilegedThirtyFourVMsOfOneSubnetOnOneHostAllWork(t *testing.T) {
	l := upLab(t, scaleTopology())
	last := fmt.Sprintf("w%02d", scaleVMs)
	// Receivers: the 33rd and 34th member on the sender's host, the
	// subnet's VM on the other host, and another tenant's VM on the
	// sender's host, which must get nothing.
	receivers := []string{"w33", last, "far1", "red1"}
	stops := map[string]func() []string{}
	pcaps := map[string]string{}
	for _, vm := range receivers {
		stop, pcap := l.captureFile(vm, "eth0", "udp.payload")
		stops[vm], pcaps[vm] = stop, pcap
		// Each capture must record its VM's own broadcast before the test
		// goes on: an empty capture then proves something.
		l.sendUDP(vm, "255.255.255.255", 1, "alive-"+vm)
		testenv.Eventually(t, "capture on "+vm+" to record its own packet", 5*time.Second, func() bool { return pcapHas(t, pcap, "alive-"+vm) })
	}
	l.sendUDP("w01", "10.1.1.255", 1, "scale-bcast")
	// The copies are made as w01 sends: each member's capture has it once
	// tcpdump has read it from its ring (up to a second later).
	for _, vm := range []string{"w33", last, "far1"} {
		testenv.Eventually(t, vm+" to receive w01's subnet broadcast", 5*time.Second, func() bool { return pcapHas(t, pcaps[vm], "scale-bcast") })
	}
	// red1's capture is live after the broadcast: red2's broadcast, sent
	// later, lands in it; w01's never does.
	l.sendUDP("red2", "255.255.255.255", 1, "after-bcast")
	testenv.Eventually(t, "red1 to receive red2's broadcast", 5*time.Second, func() bool { return pcapHas(t, pcaps["red1"], "after-bcast") })
	for _, vm := range receivers {
		got := strings.Join(stops[vm](), " ")
		if has := strings.Contains(got, hexOf("scale-bcast")); has != (vm != "red1") {
			t.Errorf("%s received w01's subnet broadcast: %v (its capture: %s)", vm, has, got)
		}
	}
	// Unicast inside the large subnet, on the host and across hosts, and
	// the other tenant on the same host.
	for _, p := range [][2]string{{"w01", last}, {last, "w01"}, {last, "far1"}, {"far1", "w33"}, {"red1", "red2"}} {
		if err := l.ping(p[0], l.ip(p[1]), 3); err != nil {
			t.Error(err)
		}
	}
	// The host reports every VM under its datapath.
	if n := l.metrics("h1").at("onehop_local_vms"); n != scaleVMs+1 {
		t.Errorf("h1 has %v VMs under its datapath, want %d", n, scaleVMs+1)
	}
}

// pcapHas reports whether a capture file written with tcpdump -U holds a
// packet carrying payload, before tcpdump is stopped.
func pcapHas(t *testing.T, pcap, payload string) bool {
	t.Helper()
	b, err := os.ReadFile(pcap)
	if err != nil && !os.IsNotExist(err) {
		t.Fatalf("read %s: %v", pcap, err)
	}
	return bytes.Contains(b, []byte(payload))
}

// hexOf is how tshark prints a payload.
func hexOf(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "%02x", s[i])
	}
	return b.String()
}
