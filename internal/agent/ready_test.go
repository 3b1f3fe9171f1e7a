package agent

import (
	"fmt"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/version"
)

// The agent's /readyz: ready only once a pass attached and reconciled
// everything up to the latest revision of its desired state it has seen.
func TestAgentIsReadyOnlyWhenReconciledToTheLatestRevisionSeen(t *testing.T) {
	s := store.NewMemory()
	putDesired(t, s, "h1", desired())
	dp := &fakeDatapath{applyErr: fmt.Errorf("map full")}
	a := newAgent(t, s, dp, fakeInterfaces{"uplink0": 2, "vif-web1": 5, "vif-web3": 6})
	notReady := func(want string) {
		t.Helper()
		if err := a.Ready(); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Ready: %v, want not ready: %q", err, want)
		}
	}
	notReady("no reconcile pass yet")
	if _, err := a.ReconcileOnce(t.Context()); err == nil {
		t.Fatal("reconcile hid the datapath error")
	}
	notReady("the last reconcile failed: ")
	dp.applyErr = nil
	reconcile(t, a)
	if err := a.Ready(); err != nil {
		t.Fatalf("reconciled: Ready says %v", err)
	}
	st, _, _ := a.Status()
	// A change taken in from the watch and not applied yet.
	if err := a.takeFarm(intent.FarmStateKey(1), nil, st.AppliedRevision+5); err != nil {
		t.Fatal(err)
	}
	notReady(fmt.Sprintf("reconciled to revision %d, has seen %d", st.AppliedRevision, st.AppliedRevision+5))
	reconcile(t, a)
	if err := a.Ready(); err != nil {
		t.Fatalf("reconciled again: Ready says %v", err)
	}
}

func TestTheStatusRecordCarriesTheAgentsVersion(t *testing.T) {
	s := store.NewMemory()
	putDesired(t, s, "h1", desired())
	a := newAgent(t, s, &fakeDatapath{}, fakeInterfaces{"uplink0": 2, "vif-web1": 5, "vif-web3": 6})
	reconcile(t, a)
	st := publishedStatus(t, s, "h1")
	if st.Version == nil || *st.Version != version.Get() {
		t.Fatalf("status version %v, want %+v", st.Version, version.Get())
	}
}
