package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/testenv"
)

const twoSubnets = `name: %s
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: db1, host: h2, subnet: blue/db}
`

// cli runs an operator verb against the lab's controller API.
func (l *testLab) cli(args ...string) (string, error) {
	st, err := lab.Load(testRoot, l.name)
	if err != nil {
		l.t.Fatal(err)
	}
	out, err := exec.Command(binary, append(args, "--api", st.APISocket)...).CombinedOutput()
	return string(out), err
}

func TestPrivilegedOperatorVerbsChangeTheDatapathThroughTheAPI(t *testing.T) {
	testenv.RequireTool(t, "iperf3")
	l := upLab(t, twoSubnets)
	db1 := l.ip("db1")
	l.start("db1", "iperf3", "-s", "-p", "5432")
	l.waitListening("db1", "tcp", 5432)
	connects := func() bool {
		// timeout: a rule landing mid-test can strand iperf3 between its
		// control and data connections.
		_, err := l.in("web1", "timeout", "5", "iperf3", "-c", db1, "-p", "5432", "-n", "1M", "-C", "cubic", "--connect-timeout", "1000")
		return err == nil
	}
	if connects() {
		t.Fatal("web1 reached db1:5432 before any rule")
	}

	if out, err := l.cli("get", "vms"); err != nil || !strings.Contains(out, "blue/db/db1") || !strings.Contains(out, db1) {
		t.Fatalf("get vms: %v\n%s", err, out)
	}
	if out, err := l.cli("allow", "blue/web", "blue/nope", "--proto", "tcp", "--port", "5432"); err == nil || !strings.Contains(out, `to: no subnet "blue/nope"`) {
		t.Errorf("allow to an unknown subnet: %v\n%s", err, out)
	}
	if out, err := l.cli("allow", "blue/web", "blue/db", "--proto", "tcp", "--port", "5432"); err != nil {
		t.Fatalf("allow: %v\n%s", err, out)
	}
	// API -> etcd -> controller -> agents -> BPF maps.
	testenv.Eventually(t, "the rule to reach the datapath", 10*time.Second, connects)
	if out, err := l.cli("get", "rules"); err != nil || !strings.Contains(out, "blue/web") || !strings.Contains(out, "true") {
		t.Errorf("get rules does not show the rule in force (%v):\n%s", err, out)
	}

	// The VM's own firewall can still refuse what visibility allows.
	if out, err := l.cli("firewall", "add", "blue/db/db1", "--in", "--proto", "tcp", "--port", "5432", "--deny"); err != nil {
		t.Fatalf("firewall add: %v\n%s", err, out)
	}
	testenv.Eventually(t, "the firewall to reach the datapath", 10*time.Second, func() bool { return !connects() })
	testenv.Eventually(t, "stats to show the firewall drop", 15*time.Second, func() error {
		out, err := l.cli("stats", "--node", "h2")
		if err != nil {
			return fmt.Errorf("onehop stats: %v: %s", err, out)
		}
		if !strings.Contains(out, "firewall_in") {
			return fmt.Errorf("no firewall_in in:\n%s", out)
		}
		return nil
	})
}
