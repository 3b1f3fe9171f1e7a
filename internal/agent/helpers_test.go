package agent

import (
	"context"
	"net/netip"
	"testing"

	desiredstore "github.com/onehop/onehop/internal/desired"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// putDesired stores the node's desired state as the controller would.
func putDesired(t *testing.T, s store.Store, node string, d intent.Desired) {
	t.Helper()
	d.Node = node
	if err := desiredstore.Write(context.Background(), s, d); err != nil {
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

// writeDesired stores d as the controller would, as the keys of its node.
func writeDesired(ctx context.Context, s store.Store, d intent.Desired) error {
	return desiredstore.Write(ctx, s, d)
}

// storedDigest is the digest of node's desired state as the store holds it
// (what the lab compares an agent's report with).
func storedDigest(t *testing.T, s store.Store, node string) string {
	t.Helper()
	d, _, err := desiredstore.Read(context.Background(), s, node)
	if err != nil {
		t.Fatal(err)
	}
	return d.Digest()
}
