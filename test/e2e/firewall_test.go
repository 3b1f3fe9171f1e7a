package e2e

import (
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/testenv"
)

const withFirewall = `name: %s
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}]
vms:
  - name: web1
    host: h1
    subnet: blue/web
    firewall:
      default_in: deny
      rules:
        - {dir: in, proto: tcp, port: "5201", cidr: 10.1.1.0/24, action: allow}
  - {name: web2, host: h2, subnet: blue/web}
`

func TestPrivilegedVMFirewallAdmitsOnlyItsRulesAndReplies(t *testing.T) {
	testenv.RequireTool(t, "iperf3")
	l := upLab(t, withFirewall)
	web1, web2 := l.ip("web1"), l.ip("web2")

	// Inbound: tcp/5201 is allowed, ping is not (default deny).
	l.start("web1", "iperf3", "-s", "-p", "5201")
	l.waitListening("web1", "tcp", 5201)
	if o, err := l.in("web2", "iperf3", "-c", web1, "-n", "5M", "-C", "cubic"); err != nil || !strings.Contains(o, "receiver") {
		t.Errorf("tcp/5201 into web1 (allowed by its firewall) failed: %v\n%s", err, o)
	}
	before := l.metrics("h1")
	if err := l.ping("web2", web1, 2); err == nil {
		t.Error("web2 pinged web1 through its default-deny firewall")
	}
	if d := rise(before, l.metrics("h1"), drops("firewall_in")); d < 2 {
		t.Errorf("firewall_in drops rose by %v, want the 2 echo requests", d)
	}
	// Outbound from web1 is open, and the replies come back in: stateful.
	if err := l.ping("web1", web2, 2); err != nil {
		t.Errorf("web1's own ping out got no replies through its firewall: %v", err)
	}
}
