package e2e

import (
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/testenv"
)

// TestPrivilegedAnAgentCertificateCannotWriteAnotherHostsKeys plays a
// compromised hypervisor: from h1's namespace, with h1's agent certificate
// and key, etcdctl tries to write h2's status and node records, a desired
// key of h2 and a farm's intent. etcd itself refuses each (permission
// denied) and the keys are unchanged, while the same certificate, from the
// same place, reads h2's node record and writes h1's own; the lab came up
// with etcd's auth on (a user and role per host) and its VMs talk.
func TestPrivilegedAnAgentCertificateCannotWriteAnotherHostsKeys(t *testing.T) {
	testenv.RequireTool(t, "etcdctl")
	l := upLab(t, quickstart)
	st, err := lab.Load(testRoot, l.name)
	if err != nil {
		t.Fatal(err)
	}
	agent := lab.TLSFiles(st, "agent-h1")
	// etcdctl as h1's agent over the fabric; as root over the unix socket
	// (the controller's identity, etcd's administrator).
	asH1 := func(args ...string) (string, error) {
		return l.in("h1", append([]string{"etcdctl", "--endpoints", st.EtcdURL, "--cacert", agent.CA,
			"--cert", agent.Cert, "--key", agent.Key, "--dial-timeout", "5s", "--command-timeout", "5s"}, args...)...)
	}
	asRoot := func(args ...string) string {
		t.Helper()
		out, err := l.in("h1", append([]string{"etcdctl", "--endpoints", "unix://" + st.EtcdSocket}, args...)...)
		if err != nil {
			t.Fatalf("etcdctl %v over the lab's socket: %v\n%s", args, err, out)
		}
		return out
	}

	// etcd's auth is on: each host has its user and role.
	roles := asRoot("role", "list")
	for _, want := range []string{"root", "onehop-agent-h1", "onehop-agent-h2"} {
		if !strings.Contains(roles, want+"\n") {
			t.Errorf("etcd role list has no %s:\n%s", want, roles)
		}
	}
	if out := asRoot("user", "get", "h1"); !strings.Contains(out, "onehop-agent-h1") || strings.Contains(out, "root") {
		t.Errorf("etcd user h1: want role onehop-agent-h1 only:\n%s", out)
	}

	// What h1's certificate may do: read h2's node record, write its own
	// (the value it has, so the agent's state is unchanged).
	h2Node, err := asH1("get", intent.NodesPrefix+"h2", "--print-value-only")
	if err != nil || !strings.Contains(h2Node, `"h2"`) {
		t.Fatalf("h1's certificate reading h2's node record: %v\n%s", err, h2Node)
	}
	h1Node, err := asH1("get", intent.NodesPrefix+"h1", "--print-value-only")
	if err != nil || !strings.Contains(h1Node, `"h1"`) {
		t.Fatalf("h1's certificate reading its node record: %v\n%s", err, h1Node)
	}
	if out, err := asH1("put", intent.NodesPrefix+"h1", strings.TrimSpace(h1Node)); err != nil || !strings.Contains(out, "OK") {
		t.Fatalf("h1's certificate writing its own node record: %v\n%s", err, out)
	}

	// What it may not: etcd answers permission denied, and nothing changes.
	for _, key := range []string{
		intent.StatusPrefix + "h2",
		intent.NodesPrefix + "h2",
		intent.DesiredVMKey("h2", "blue/web/web2"),
		intent.FarmsPrefix + "blue",
	} {
		before := asRoot("get", key, "--print-value-only")
		if strings.TrimSpace(before) == "" {
			t.Fatalf("%s: no value in etcd to protect", key)
		}
		out, err := asH1("put", key, "owned by h1")
		if err == nil || !strings.Contains(out, "permission denied") {
			t.Errorf("h1's certificate writing %s: %v\n%s\nwant etcd's permission denied", key, err, out)
		}
		if out, err := asH1("del", key); err == nil || !strings.Contains(out, "permission denied") {
			t.Errorf("h1's certificate deleting %s: %v\n%s\nwant etcd's permission denied", key, err, out)
		}
		if after := asRoot("get", key, "--print-value-only"); after != before && !strings.HasPrefix(key, intent.StatusPrefix) {
			t.Errorf("%s changed: %q, was %q", key, after, before)
		} else if strings.Contains(after, "owned by h1") {
			t.Errorf("%s holds h1's write: %q", key, after)
		}
	}
	// Nor may it read another host's desired state.
	if out, err := asH1("get", "--prefix", intent.DesiredHostPrefix("h2")); err == nil || !strings.Contains(out, "permission denied") {
		t.Errorf("h1's certificate reading h2's desired keys: %v\n%s\nwant permission denied", err, out)
	}

	// The lab works with auth on: the agents applied their state (upLab
	// waited for it) and VMs on the two hosts talk.
	if err := l.ping("web1", l.ip("web2"), 3); err != nil {
		t.Fatal(err)
	}
}
