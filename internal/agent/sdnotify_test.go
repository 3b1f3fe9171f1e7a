package agent

import (
	"errors"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/sdnotify/sdnotifytest"
)

// Under systemd (Type=notify) the agent says READY=1 only after its first
// pass that attached and reconciled the whole desired state: not while
// the datapath refuses it, and by the time the datagram arrives the
// datapath holds the host's VMs.
func TestTheAgentTellsSystemdItIsReadyAfterItsFirstSuccessfulPass(t *testing.T) {
	notify := sdnotifytest.Listen(t)

	s := newWatchedStore()
	ifs := fakeInterfaces{"uplink0": 2}
	for i := range 3 {
		ifs[localVM(i).Interface] = 10 + i
		putJSON(t, s, intent.DesiredVMKey("h1", localVM(i).Name), localVM(i))
	}
	dp := &fakeDatapath{applyErr: errors.New("the datapath refuses for now")}
	a, err := New(Config{Node: "h1", Uplink: "uplink0", Resync: 50 * time.Millisecond}, s, dp, ifs, quiet())
	if err != nil {
		t.Fatal(err)
	}
	a.SetHooks(Hooks{Ready: readyNotifier(quiet())})
	runAgent(t, a)

	if got := notify.Receive(500 * time.Millisecond); got != "" {
		t.Fatalf("%q while every pass failed", got)
	}
	if _, _, failures := a.Status(); failures == 0 {
		t.Fatal("no pass failed yet: the test proves nothing")
	}
	dp.mu.Lock()
	dp.applyErr = nil
	dp.mu.Unlock()
	if got := notify.Receive(10 * time.Second); got != "READY=1\nSTATUS=attached and reconciled\n" {
		t.Fatalf("notification %q, want READY=1 with its status", got)
	}
	st, _, _ := a.Status()
	dp.mu.Lock()
	uplink := dp.uplink
	dp.mu.Unlock()
	if endpoints := st.Endpoints; endpoints != 3 || uplink != "uplink0" {
		t.Fatalf("READY=1 sent with %d of 3 VMs applied, uplink %q attached", endpoints, uplink)
	}
	// Once: later passes say nothing more.
	if got := notify.Receive(300 * time.Millisecond); got != "" {
		t.Fatalf("a second notification %q", got)
	}
}
