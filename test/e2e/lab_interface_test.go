package e2e

import (
	"testing"

	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/netns"
)

// namedInterfaceLab gives web1 an interface name of its own.
const namedInterfaceLab = `name: %s
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}]
vms:
  - {name: web1, host: h1, subnet: blue/web, interface: tap-web1}
  - {name: web2, host: h2, subnet: blue/web}
`

// A topology's `interface:` is honoured end to end: the controller's
// record has it, the lab makes the veth's host end under that name (and no
// default vif), h1's agent attaches to it, and web1 reaches web2.
func TestPrivilegedATopologyVMsInterfaceNameIsTheVethTheLabMakesAndTheAgentAttaches(t *testing.T) {
	l := upLab(t, namedInterfaceLab)
	if vm := l.vmRecord("blue/web/web1"); vm.Interface != "tap-web1" {
		t.Fatalf("the controller's web1 has interface %q, want tap-web1", vm.Interface)
	}
	h, err := netns.Handle(lab.NamespaceOf(l.name, "h1"))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.LinkByName("tap-web1"); err != nil {
		t.Fatalf("no tap-web1 on h1: %v", err)
	}
	if _, err := h.LinkByName(blueWeb1Vif); err == nil {
		t.Fatalf("h1 has web1's default vif %s too", blueWeb1Vif)
	}
	l.awaitVifKind("h1", "veth", "tap-web1")
	if err := l.ping("web1", l.ip("web2"), 2); err != nil {
		t.Fatalf("web1 -> web2: %v", err)
	}
}
