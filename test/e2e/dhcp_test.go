package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/testenv"
)

const withDHCP = `name: %s
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web, dhcp: true}
`

// udhcpcScript applies a lease to the VM's interface only (Debian's default
// script would also rewrite the machine's /etc/resolv.conf) and records it.
const udhcpcScript = `#!/bin/sh
case "$1" in
bound|renew)
  ip addr flush dev "$interface"
  ip addr add "$ip/$subnet" dev "$interface"
  ip route replace default via "${router%% *}" dev "$interface"
  echo "ip=$ip subnet=$subnet router=$router lease=$lease serverid=$serverid" > "$LEASE_FILE"
  ;;
esac
`

func TestPrivilegedDHCPClientGetsItsAddressFromItsOwnHost(t *testing.T) {
	testenv.RequireTool(t, "udhcpc")
	l := upLab(t, withDHCP)
	dir := t.TempDir()
	script := filepath.Join(dir, "udhcpc.sh")
	leaseFile := filepath.Join(dir, "lease")
	if err := os.WriteFile(script, []byte(udhcpcScript), 0o755); err != nil {
		t.Fatal(err)
	}
	want := l.node("web2").VM.IP

	if out := l.mustIn("web2", "ip", "-4", "addr", "show", "eth0"); strings.Contains(out, "inet ") {
		t.Fatalf("web2 starts with an address already:\n%s", out)
	}
	// web1's datagrams to web2's address cross the fabric (h2 delivers them
	// to web2 whether or not it has taken its address yet): they prove the
	// fabric's capture live.
	fabric := l.watchFabric("web1", "web2")
	proveLive(t, "start", fabric)
	before := l.metrics("h2")
	out, err := l.in("web2", "env", "LEASE_FILE="+leaseFile, "udhcpc", "-i", "eth0", "-n", "-q", "-f", "-t", "3", "-T", "1", "-s", script)
	if err != nil {
		t.Fatalf("udhcpc: %v\n%s", err, out)
	}
	lease, err := os.ReadFile(leaseFile)
	if err != nil {
		t.Fatalf("udhcpc succeeded but its script recorded no lease: %v\n%s", err, out)
	}
	for _, w := range []string{"ip=" + want + " ", "subnet=255.255.255.0", "router=10.1.1.1", "lease=604800", "serverid=10.1.1.1"} {
		if !strings.Contains(string(lease), w) {
			t.Errorf("lease %q lacks %q", lease, w)
		}
	}
	if addr := l.mustIn("web2", "ip", "-4", "addr", "show", "eth0"); !strings.Contains(addr, "inet "+want+"/24") {
		t.Errorf("web2 eth0 after DHCP:\n%s", addr)
	}
	if err := l.ping("web2", l.ip("web1"), 2); err != nil {
		t.Errorf("web2 with its DHCP address cannot reach web1: %v", err)
	}
	stopWatches(t, fabric)
	for _, f := range fabric.frames {
		for _, port := range []string{f.sport, f.dport} {
			if port == "67" || port == "68" {
				t.Errorf("DHCP left the host onto the fabric: %s", f)
			}
		}
	}
	if d := rise(before, l.metrics("h2"), forwards("to_agent")); d < 2 {
		t.Errorf("to_agent rose by %v; want DISCOVER and REQUEST handed to the agent", d)
	}
}
