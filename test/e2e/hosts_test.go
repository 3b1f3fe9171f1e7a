package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/testenv"
)

// TestPrivilegedHostJoinsAndLeaves adds a fourth host to a running lab
// (host add, then its namespace, certificate and agent), places a VM on it
// that reaches a VM on another host both ways, is refused the host's
// removal while the VM is placed there (the 409 names it), drains it, and
// finds no key of the host left in etcd and, after lab down, nothing of the
// lab left at all.
func TestPrivilegedHostJoinsAndLeaves(t *testing.T) {
	var l *testLab
	// Registered before upLab's own cleanup, so it runs after its lab down.
	t.Cleanup(func() {
		if l == nil {
			return
		}
		if left, _ := netns.List(lab.NamespaceOf(l.name, "")); len(left) > 0 {
			t.Errorf("lab down left namespaces: %v", left)
		}
		if _, err := os.Stat(filepath.Join(testRoot, l.name)); err == nil {
			t.Errorf("lab down left its state directory")
		}
	})
	l = upLab(t, `name: %s
hosts: [{name: h1}, {name: h2}, {name: h3}]
farms:
  - name: blue
    subnets: [{name: web}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
  - {name: web3, host: h3, subnet: blue/web}
`)
	l.onehop("lab", "add-host", "h4")
	st, err := lab.Load(testRoot, l.name)
	if err != nil {
		t.Fatal(err)
	}
	if st.Kinds["h4"] != "host" || !netns.Exists(lab.NamespaceOf(l.name, "h4")) {
		t.Fatalf("h4 is not a host of the lab's state: kinds %v", st.Kinds)
	}
	if out, err := l.cli("get", "hosts"); err != nil || !strings.Contains(out, "h4") {
		t.Fatalf("get hosts: %v\n%s", err, out)
	}
	s, err := store.DialEtcd([]string{"unix://" + st.EtcdSocket})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The agent registered its uplink by itself.
	var n intent.Node
	testenv.Eventually(t, "h4's agent to register its uplink", 10*time.Second, func() bool {
		return store.GetJSON(context.Background(), s, intent.NodesPrefix+"h4", &n) == nil && n.UplinkMAC != ""
	})

	// A VM placed on h4 (moved there, as a live migration would) reaches
	// VMs on the other hosts, both ways.
	l.onehop("lab", "move", "web3", "--to", "h4")
	testenv.Eventually(t, "web3 on h4 and web1 on h1 to reach each other", 15*time.Second, func() bool {
		return l.ping("web3", l.ip("web1"), 3) == nil && l.ping("web1", l.ip("web3"), 3) == nil
	})
	if err := l.ping("web2", l.ip("web3"), 3); err != nil {
		t.Fatal(err)
	}
	// And a VM created there through the API.
	if out, err := l.cli("vm", "create", "blue/web/web4", "--host", "h4"); err != nil {
		t.Fatalf("vm create on h4: %v\n%s", err, out)
	}

	out, err := l.cli("host", "remove", "h4")
	if err == nil || !strings.Contains(out, "blue/web/web3") || !strings.Contains(out, "blue/web/web4") || !strings.Contains(out, "--drain") {
		t.Fatalf("host remove with VMs placed: %v\n%s\nwant a refusal naming blue/web/web3 and blue/web/web4", err, out)
	}
	if _, err := s.Get(context.Background(), intent.HostsPrefix+"h4"); err != nil {
		t.Fatalf("the refused removal removed h4: %v", err)
	}

	l.onehop("lab", "remove-host", "h4", "--drain")
	kvs, _, err := s.List(context.Background(), intent.Root)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range kvs {
		if strings.Contains(k, "/h4") || (strings.HasPrefix(k, intent.Prefix) && strings.Contains(string(v), `"h4"`)) {
			t.Errorf("key %s of h4 left in etcd: %s", k, v)
		}
	}
	if netns.Exists(lab.NamespaceOf(l.name, "h4")) {
		t.Error("h4's namespace is still there")
	}
	// The rest of the lab carries on.
	if err := l.ping("web1", l.ip("web2"), 3); err != nil {
		t.Fatal(err)
	}
}
