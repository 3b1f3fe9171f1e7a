package agent

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func mustMAC(t testing.TB, s string) net.HardwareAddr {
	t.Helper()
	m, err := net.ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// waitUntil polls ok until it holds, failing the test after 5 s; what says
// what was awaited.
func waitUntil(t *testing.T, ok func() bool, what ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", strings.Join(what, " "))
		}
		time.Sleep(10 * time.Millisecond) // the poll interval
	}
}

// putDesired stores the node's desired state as the controller would.
func putDesired(t *testing.T, s store.Store, node string, d intent.Desired) {
	t.Helper()
	if err := store.PutJSON(context.Background(), s, intent.DesiredPrefix+node, d); err != nil {
		t.Fatalf("put desired state of %s: %v", node, err)
	}
}

// reconcile runs one pass that must succeed.
func reconcile(t *testing.T, a *Agent) {
	t.Helper()
	if _, err := a.ReconcileOnce(context.Background()); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
}

// publishedStatus reads the status the agent published for its node.
func publishedStatus(t *testing.T, s store.Store, node string) intent.AgentStatus {
	t.Helper()
	var st intent.AgentStatus
	if err := store.GetJSON(context.Background(), s, intent.StatusPrefix+node, &st); err != nil {
		t.Fatalf("status of %s: %v", node, err)
	}
	return st
}
