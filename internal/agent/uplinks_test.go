package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/store"
)

// attachCounter is the fake datapath counting the uplink program's
// attaches, by "name@ifindex"; failNext makes the next one fail.
type attachCounter struct {
	fakeDatapath
	amu      sync.Mutex
	attaches map[string]int
	failNext bool
}

func (c *attachCounter) AttachUplink(name string, ifindex int) error {
	c.amu.Lock()
	defer c.amu.Unlock()
	if c.attaches == nil {
		c.attaches = map[string]int{}
	}
	c.attaches[fmt.Sprintf("%s@%d", name, ifindex)]++
	if c.failNext {
		c.failNext = false
		return errors.New("attach refused (test)")
	}
	return c.fakeDatapath.AttachUplink(name, ifindex)
}

// count is how many times name was attached at ifindex.
func (c *attachCounter) count(name string, ifindex int) int {
	c.amu.Lock()
	defer c.amu.Unlock()
	return c.attaches[fmt.Sprintf("%s@%d", name, ifindex)]
}

// multiHomed is an agent of h1 with a second uplink, uplink1, on dp.
func multiHomed(t *testing.T, dp Datapath, ifs fakeInterfaces) *Agent {
	t.Helper()
	s := store.NewMemory()
	putDesired(t, s, "h1", desired())
	a, err := New(Config{Node: "h1", Uplink: "uplink0", MoreUplinks: []string{"uplink1"}, Resync: time.Hour}, s, dp, ifs, quiet())
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// resyncs runs n resync passes, as the agent's ticker does.
func resyncs(t *testing.T, a *Agent, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if _, err := a.pass(context.Background(), "resync", 0); err != nil {
			t.Fatalf("resync %d: %v", i, err)
		}
	}
}

func TestEveryUplinkIsAttachedOncePerIfindexNotOnEveryPass(t *testing.T) {
	dp := &attachCounter{}
	ifs := fakeInterfaces{"uplink0": 2, "uplink1": 3, "vif-web1": 5, "vif-web3": 6}
	a := multiHomed(t, dp, ifs)
	reconcile(t, a)
	resyncs(t, a, 9)
	if n := dp.count("uplink1", 3); n != 1 {
		t.Errorf("uplink1 attached %d times in 10 passes, want once", n)
	}
	if n := dp.count("uplink0", 2); n != 1 {
		t.Errorf("uplink0 (the router's) attached %d times in 10 passes, want once", n)
	}

	// Both interfaces made again: new ifindexes, attached again, once.
	ifs["uplink1"], ifs["uplink0"] = 7, 8
	resyncs(t, a, 5)
	if n := dp.count("uplink1", 7); n != 1 {
		t.Errorf("uplink1 at its new ifindex 7 attached %d times in 5 passes, want once", n)
	}
	if n := dp.count("uplink0", 8); n != 1 {
		t.Errorf("uplink0 at its new ifindex 8 attached %d times in 5 passes, want once", n)
	}
	if n := dp.count("uplink1", 3); n != 1 {
		t.Errorf("uplink1 attached at its old ifindex again (%d times in all)", n)
	}
}

func TestAFailedUplinkAttachIsTriedAgainNextPass(t *testing.T) {
	dp := &attachCounter{failNext: true}
	ifs := fakeInterfaces{"uplink0": 2, "uplink1": 3, "vif-web1": 5, "vif-web3": 6}
	a := multiHomed(t, dp, ifs)
	// uplink1 is the first attach of a pass: it fails, and the pass with it.
	if _, err := a.ReconcileOnce(context.Background()); err == nil {
		t.Fatal("a pass whose uplink attach failed reported no error")
	}
	resyncs(t, a, 3)
	if n := dp.count("uplink1", 3); n != 2 {
		t.Errorf("uplink1 attached %d times (a failure, then 3 passes), want 2: the failure retried once", n)
	}
	if st, _, _ := a.Status(); st.Error != "" {
		t.Errorf("status error %q after the retry succeeded", st.Error)
	}
}

func TestAFailedRouterUplinkAttachIsTriedAgainNextPass(t *testing.T) {
	dp := &attachCounter{failNext: true}
	s := store.NewMemory()
	putDesired(t, s, "h1", desired())
	a := newAgent(t, s, dp, fakeInterfaces{"uplink0": 2, "vif-web1": 5, "vif-web3": 6})
	if _, err := a.ReconcileOnce(context.Background()); err == nil {
		t.Fatal("a pass whose uplink attach failed reported no error")
	}
	resyncs(t, a, 3)
	if n := dp.count("uplink0", 2); n != 2 {
		t.Errorf("uplink0 attached %d times (a failure, then 3 passes), want 2: the failure retried once", n)
	}
}
