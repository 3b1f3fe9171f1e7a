package e2e

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/netns"
)

// blueWeb1Vif is the default interface of blue/web/web1, the VM most labs
// here have: derived from its farm and name (intent.VifName).
var blueWeb1Vif = intent.VifName("blue", "web1")

// sameNames gives blue and red each a web1, both on h1; web2 (blue) and
// app2 (red) are names only one farm has.
const sameNames = `name: %s
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}]
  - name: red
    subnets: [{name: web}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web1, host: h1, subnet: red/web}
  - {name: web2, host: h2, subnet: blue/web}
  - {name: app2, host: h2, subnet: red/web}
`

// Names are the tenant's (issue 21): blue/web1 and red/web1 on one host are
// two VMs, each with its own address, interface and namespace; each reaches
// its own farm's other VM, and neither reaches anything of the other farm,
// the other web1 on its own host included. `lab exec web1` names neither
// and says which there are; FARM/VM and FARM/SUBNET/VM name one.
func TestPrivilegedTwoFarmsEachHaveAWeb1OnOneHost(t *testing.T) {
	l := upLab(t, sameNames)
	blue, red := l.vmRecord("blue/web/web1"), l.vmRecord("red/web/web1")
	if blue.Host != "h1" || red.Host != "h1" || blue.IP == red.IP || subnetOf(blue.IP) == subnetOf(red.IP) {
		t.Fatalf("blue/web1 %s on %s, red/web1 %s on %s: want both on h1, in their farms' own subnets", blue.IP, blue.Host, red.IP, red.Host)
	}
	if blue.Interface != intent.VifName("blue", "web1") || red.Interface != intent.VifName("red", "web1") || blue.Interface == red.Interface {
		t.Fatalf("interfaces: blue/web1 %q, red/web1 %q; want each its own VifName", blue.Interface, red.Interface)
	}
	// The lab's nodes: FARM/VM for the shared name, its own for the others.
	for node, ip := range map[string]string{"blue/web1": blue.IP, "red/web1": red.IP} {
		if n := l.node(node); n.Kind != "vm" || n.VM == nil || n.VM.IP != ip || !netns.Exists(lab.NamespaceOf(l.name, node)) {
			t.Errorf("node %s: %+v; want a VM with %s and its own namespace", node, n, ip)
		}
	}
	for _, n := range l.status.Nodes {
		if n.Name == "web1" {
			t.Errorf("the lab has a node web1 (%s): the name is two VMs'", n.Kind)
		}
	}
	// h1 holds both vifs, and its agent is on both.
	h1 := l.node("h1")
	for _, vif := range []string{blue.Interface, red.Interface} {
		if l.mac("h1", vif) == "" || h1.Agent == nil || !strings.Contains(strings.Join(h1.Agent.AttachedVifs, " "), vif) {
			t.Errorf("h1: vif %s missing or not attached (agent %+v)", vif, h1.Agent)
		}
	}
	// Each VM's eth0 has its own farm's address, whichever way it is named.
	for name, ip := range map[string]string{"blue/web1": blue.IP, "blue/web/web1": blue.IP, "red/web1": red.IP, "red/web/web1": red.IP} {
		if out := l.mustIn(name, "ip", "-4", "-br", "addr", "show", "eth0"); !strings.Contains(out, " "+ip+"/24") {
			t.Errorf("lab exec %s: eth0 has %q, want %s", name, strings.TrimSpace(out), ip)
		}
	}
	out, err := l.in("web1", "true")
	if err == nil || !strings.Contains(out, "blue/web/web1, red/web/web1") || !strings.Contains(out, "FARM/VM") {
		t.Errorf("lab exec web1: %v, want a refusal listing blue/web/web1 and red/web/web1:\n%s", err, out)
	}
	l.mustIn("web2", "true") // a name one farm has is a node as before

	web2, app2 := l.ip("web2"), l.ip("app2")
	if err := l.ping("blue/web1", web2, 2); err != nil {
		t.Errorf("blue/web1 -> web2 (its farm's): %v", err)
	}
	if err := l.ping("red/web1", app2, 2); err != nil {
		t.Errorf("red/web1 -> app2 (its farm's): %v", err)
	}

	// Every VM's capture, each proven live by a VM of its own farm.
	ws := []*watch{l.watchVM("blue/web1", "web2"), l.watchVM("red/web1", "app2"), l.watchVM("web2", "blue/web1"), l.watchVM("app2", "red/web1")}
	proveLive(t, "start", ws...)
	l.sendUDPFrom("blue/web1", web2, 0, 9999, 64, "own-blue")
	l.sendUDPFrom("red/web1", app2, 0, 9999, 64, "own-red")
	forbidden := map[string][2]string{ // payload -> from, to
		"cross-b1-r1": {"blue/web1", red.IP}, "cross-r1-b1": {"red/web1", blue.IP},
		"cross-b1-a2": {"blue/web1", app2}, "cross-r1-w2": {"red/web1", web2},
	}
	for payload, ft := range forbidden {
		l.sendUDPFrom(ft[0], ft[1], 0, 9999, 64, payload)
	}
	if err := l.ping("blue/web1", red.IP, 1); err == nil {
		t.Error("blue/web1 pinged red/web1 on its own host")
	}
	stopWatches(t, ws...)
	farmOf := map[string]string{"blue/web1": blue.IP, "web2": web2, "red/web1": red.IP, "app2": app2}
	for _, w := range ws {
		own := subnetOf(farmOf[w.node])
		for _, f := range w.frames {
			if strings.HasPrefix(f.payload, "cross-") || f.ipSrc != "" && subnetOf(f.ipSrc) != own {
				t.Errorf("%s received from the other farm: %s", w.node, f)
			}
		}
	}
	for node, payload := range map[string]string{"web2": "own-blue", "app2": "own-red"} {
		if !received(ws, node, payload) {
			t.Errorf("%s never received %q from its own farm's web1", node, payload)
		}
	}

	// lab move names a VM as lab exec does: web1 is either, red/web1 one.
	if out, err := exec.Command(binary, "lab", "move", "web1", "--to", "h2", "--root", testRoot, "--lab", l.name).CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "blue/web/web1, red/web/web1") {
		t.Errorf("lab move web1: %v, want a refusal listing both:\n%s", err, out)
	}
	l.onehop("lab", "move", "red/web1", "--to", "h2")
	if r, b := l.vmRecord("red/web/web1"), l.vmRecord("blue/web/web1"); r.Host != "h2" || r.IP != red.IP || b.Host != "h1" {
		t.Errorf("after lab move red/web1 --to h2: red/web1 on %s (%s), blue/web1 on %s; want h2 (%s) and h1", r.Host, r.IP, b.Host, red.IP)
	}
	if err := l.ping("red/web1", app2, 2); err != nil {
		t.Errorf("red/web1 on h2 -> app2: %v", err)
	}
	if err := l.ping("blue/web1", web2, 2); err != nil {
		t.Errorf("blue/web1, which stayed, -> web2: %v", err)
	}
}

// received says whether the stopped watch of node recorded a datagram with payload.
func received(ws []*watch, node, payload string) bool {
	for _, w := range ws {
		if w.node != node {
			continue
		}
		for _, f := range w.frames {
			if f.payload == payload {
				return true
			}
		}
	}
	return false
}
