package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
)

const vnatSubnets = `name: %s
hosts: [{name: h1}, {name: h2}, {name: h3}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}]
  - name: red
    subnets: [{name: web}]
vms:
  - {name: web1, host: h1, subnet: blue/web, vnat: true}
  - {name: web2, host: h1, subnet: blue/web}
  - {name: db1, host: h3, subnet: blue/db}
  - {name: red1, host: h3, subnet: red/web}
`

// pidServer listens on every address of its VM, TCP port 7000, and answers
// each connection with its pid: a process and a socket that must outlive
// the VM's change of address.
const pidServer = `
import os, socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7000)); s.listen(8)
print("listening pid %d" % os.getpid(), flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"pid %d\n" % os.getpid()); c.close()
`

// askPid connects to ADDR:7000 and prints what the server there says.
const askPid = `import socket,sys
c=socket.create_connection((sys.argv[1],7000),timeout=3)
print(c.recv(64).decode().strip())`

// leaseOnly records a DHCP lease without applying it: what the VM's host
// would give it.
const leaseOnly = `#!/bin/sh
case "$1" in
bound|renew) echo "ip=$ip router=$router" > "$LEASE_FILE" ;;
esac
`

// sendFromOld sends one UDP datagram from SRC (an address the VM no
// longer holds: IP_TRANSPARENT lets the socket bind it and the kernel route
// from it) to DST:7001.
const sendFromOld = `import socket,sys
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP,19,1)
s.bind((sys.argv[1],0))
s.sendto(b"from-the-old-address",(sys.argv[2],7001))`

func TestPrivilegedVMMovedToAnotherSubnetTakesItsNewAddressAndKeepsItsProcesses(t *testing.T) {
	testenv.RequireTool(t, "udhcpc")
	l := upLab(t, vnatSubnets)
	oldIP, db1 := l.ip("web1"), l.ip("db1")
	if oldIP != "10.1.1.2" || db1 != "10.1.2.2" {
		t.Fatalf("addresses before the move: web1 %s, db1 %s", oldIP, db1)
	}
	if n := l.node("web1"); !n.VNAT || l.node("web2").VNAT {
		t.Errorf("lab status: web1 vnat %v (want true), web2 vnat %v (want false)", n.VNAT, l.node("web2").VNAT)
	}
	// web1's VNAT daemon runs in it, and `lab exec` reaches that node's
	// own daemon: web2 has none.
	if out := l.mustIn("web1", binary, "vnat", "status", "-o", "json"); !strings.Contains(out, "{") {
		t.Errorf("web1: onehop vnat status -o json: %q", out)
	}
	if out, err := l.in("web2", binary, "vnat", "status"); err == nil || !strings.Contains(out, "is `onehop vnat run` running in this network namespace?") {
		t.Errorf("web2 (no vnat) answered onehop vnat status: %v\n%s", err, out)
	}
	server := l.start("web1", "python3", "-c", pidServer)
	testenv.Eventually(t, "web1's server to listen", 10*time.Second, func() bool { return strings.Contains(server.Output(), "listening pid ") })
	pid := strings.TrimSpace(strings.TrimPrefix(server.Output(), "listening "))
	if out := l.mustIn("web2", "python3", "-c", askPid, oldIP); strings.TrimSpace(out) != pid {
		t.Fatalf("web2 asked web1's server before the move: %q, want %q", out, pid)
	}

	// Refused before anything moves: another farm, its own subnet, a
	// subnet that does not exist.
	for _, c := range []struct{ subnet, want string }{
		{"red/web", "a VM moves only within its farm"},
		{"blue/web", "already in subnet blue/web"},
		{"blue/nope", `no subnet "blue/nope" in farm blue`},
	} {
		args := []string{"lab", "move", "web1", "--to", "h2", "--subnet", c.subnet, "--root", testRoot, "--lab", l.name}
		out, err := exec.Command(binary, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("move to %s: %v\n%s\nwant an error saying %q", c.subnet, err, out, c.want)
		}
	}
	if err := l.ping("web2", oldIP, 1); err != nil {
		t.Fatalf("a refused move left web1 unreachable: %v", err)
	}

	out := l.onehop("lab", "move", "web1", "--to", "h2", "--subnet", "blue/db")
	l.refresh()
	n := l.node("web1")
	if n.VM == nil || n.VM.Subnet != "db" || n.VM.Host != "h2" || n.VM.IP != "10.1.2.3" || n.VM.Gateway != "10.1.2.1" {
		t.Fatalf("web1 after the move (%s): %+v", strings.TrimSpace(out), n.VM)
	}
	newIP := n.VM.IP
	// Its eth0: the new address only, the new virtual MAC, a default
	// route via the new gateway.
	addrs := l.mustIn("web1", "ip", "-4", "-o", "addr", "show", "dev", "eth0")
	if !strings.Contains(addrs, " "+newIP+"/24 ") || strings.Contains(addrs, " "+oldIP+"/") {
		t.Errorf("web1's eth0 after the move:\n%s\nwant %s/24 and not %s", addrs, newIP, oldIP)
	}
	if mac := l.mac("web1", "eth0"); mac != virtualMAC(newIP) {
		t.Errorf("web1's MAC %s, want %s", mac, virtualMAC(newIP))
	}
	if r := l.mustIn("web1", "ip", "-4", "route", "show", "default"); !strings.Contains(r, "via 10.1.2.1 dev eth0") {
		t.Errorf("web1's default route: %q", r)
	}
	// Its new gateway and a VM of its new subnet answer it.
	if err := l.ping("web1", "10.1.2.1", 2); err != nil {
		t.Error(err)
	}
	if err := l.ping("web1", db1, 2); err != nil {
		t.Error(err)
	}
	// The process started before the move runs on, its socket with it:
	// db1 reaches it on the new address.
	if got := strings.TrimSpace(l.mustIn("db1", "python3", "-c", askPid, newIP)); got != pid {
		t.Errorf("web1's server after the move answered %q, want %q (the process from before)", got, pid)
	}
	select {
	case <-server.done:
		t.Errorf("web1's server ended across the move:\n%s", server.Output())
	default:
	}
	// Nobody answers on the old address (web2, which reached it before).
	if err := l.ping("web2", oldIP, 1); err == nil {
		t.Errorf("web1's old address %s still answers", oldIP)
	}
	// What its new host knows follows: its DHCP answers the new address
	// and gateway, and its anti-spoofing drops what web1 sends from the
	// old one.
	dir := t.TempDir()
	script, lease := filepath.Join(dir, "lease.sh"), filepath.Join(dir, "lease")
	if err := os.WriteFile(script, []byte(leaseOnly), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := l.in("web1", "env", "LEASE_FILE="+lease, "udhcpc", "-i", "eth0", "-n", "-q", "-f", "-t", "3", "-T", "1", "-s", script); err != nil {
		t.Fatalf("udhcpc in web1 after the move: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(lease); err != nil || strings.TrimSpace(string(b)) != "ip="+newIP+" router=10.1.2.1" {
		t.Errorf("h2's DHCP answer to web1: %q (%v), want ip=%s router=10.1.2.1", b, err, newIP)
	}
	d := l.dropDelta("h2", func() { l.mustIn("web1", "python3", "-c", sendFromOld, oldIP, db1) }, "spoofed_ip")
	if d["spoofed_ip"] < 1 {
		t.Errorf("h2 did not drop web1's datagram from its old address %s as spoofed (%v)", oldIP, d)
	}
	// Its old host serves it no more.
	if n := l.node("h1"); n.Agent == nil || strings.Contains(fmt.Sprint(n.Agent.AttachedVifs), blueWeb1Vif) {
		t.Errorf("h1 still holds web1's vif: %+v", n.Agent)
	}

	// Back to blue/web on the same host, h2: the vif stays where it is, the
	// VM takes the lowest free address of blue/web (its first, freed when
	// it left) and reaches web2 again; the server still runs.
	l.onehop("lab", "move", "web1", "--to", "h2", "--subnet", "blue/web")
	l.refresh()
	if n := l.node("web1"); n.VM == nil || n.VM.Subnet != "web" || n.VM.Host != "h2" || n.VM.IP != oldIP {
		t.Fatalf("web1 back in blue/web: %+v", n.VM)
	}
	if err := l.ping("web1", l.ip("web2"), 2); err != nil {
		t.Error(err)
	}
	if got := strings.TrimSpace(l.mustIn("web2", "python3", "-c", askPid, oldIP)); got != pid {
		t.Errorf("web1's server after the second move answered %q, want %q", got, pid)
	}
	if err := l.ping("db1", newIP, 1); err == nil {
		t.Errorf("web1's address in blue/db, %s, still answers", newIP)
	}
}
