package agent

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/arpengine"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

type pointed struct {
	ip   netip.Addr
	host string
}

type fakePointer struct{ moves []pointed }

func (f *fakePointer) PointMapping(ip netip.Addr, host net.HardwareAddr, _ uint64) error {
	f.moves = append(f.moves, pointed{ip, host.String()})
	return nil
}

func putNodes(t *testing.T, s store.Store, nodes ...intent.Node) {
	t.Helper()
	for _, n := range nodes {
		if err := store.PutJSON(context.Background(), s, intent.NodesPrefix+n.Name, n); err != nil {
			t.Fatal(err)
		}
	}
}

func TestAClaimMovesAMappingOnlyWhereTheStorePlacesTheVM(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	putNodes(t, s,
		intent.Node{Name: "h2", UplinkMAC: "aa:00:00:00:00:02"},
		intent.Node{Name: "h3", UplinkMAC: "aa:00:00:00:00:03"})
	web2 := intent.NewVM("blue", "web", "web2", "h3", mustAddr("10.1.1.3")) // moved to h3
	if err := store.PutJSON(ctx, s, intent.VMsPrefix+web2.FullName(), web2); err != nil {
		t.Fatal(err)
	}
	orphan := intent.NewVM("blue", "web", "web9", "h9", mustAddr("10.1.1.9")) // on a host without a node record
	if err := store.PutJSON(ctx, s, intent.VMsPrefix+orphan.FullName(), orphan); err != nil {
		t.Fatal(err)
	}
	fp := &fakePointer{}
	var asked []pointed
	c := NewClaimChecker(s, fp, func() time.Duration { return time.Second },
		func(vm netip.Addr, host net.HardwareAddr) { asked = append(asked, pointed{vm, host.String()}) }, quiet())
	mac := func(m string) net.HardwareAddr { h, _ := net.ParseMAC(m); return h }
	for _, tc := range []struct {
		name  string
		claim arpengine.Answer
		moved bool
	}{
		{"the host the store places the VM on", arpengine.Answer{VM: mustAddr("10.1.1.3"), HostMAC: mac("aa:00:00:00:00:03")}, true},
		{"a known host the store does not place it on", arpengine.Answer{VM: mustAddr("10.1.1.3"), HostMAC: mac("aa:00:00:00:00:02")}, false},
		{"a MAC of no node", arpengine.Answer{VM: mustAddr("10.1.1.3"), HostMAC: mac("aa:00:00:00:00:99")}, false},
		{"an address no VM has", arpengine.Answer{VM: mustAddr("10.1.1.77"), HostMAC: mac("aa:00:00:00:00:03")}, false},
		{"a VM whose host has no node record", arpengine.Answer{VM: mustAddr("10.1.1.9"), HostMAC: mac("aa:00:00:00:00:03")}, false},
	} {
		moved, err := c.Check(ctx, tc.claim)
		if err != nil || moved != tc.moved {
			t.Errorf("%s: moved %v (err %v), want %v", tc.name, moved, err, tc.moved)
		}
	}
	if len(fp.moves) != 1 || fp.moves[0] != (pointed{mustAddr("10.1.1.3"), "aa:00:00:00:00:03"}) {
		t.Errorf("entries moved: %v, want only 10.1.1.3 to h3", fp.moves)
	}
	if len(asked) != 1 || asked[0] != fp.moves[0] {
		t.Errorf("questions sent: %v, want one to h3 about 10.1.1.3 (its answer confirms the entry)", asked)
	}
	if acc, ref := c.Counts(); acc != 1 || ref != 4 {
		t.Errorf("counted %d accepted, %d refused; want 1 and 4", acc, ref)
	}
}

func TestTheDatapathHearsTheHostsTheStoreListsButNotItself(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	if err := writeDesired(ctx, s, desired()); err != nil {
		t.Fatal(err)
	}
	putNodes(t, s,
		intent.Node{Name: "h1", UplinkMAC: "aa:00:00:00:00:01"},
		intent.Node{Name: "h2", UplinkMAC: "aa:00:00:00:00:02"},
		intent.Node{Name: "h3", UplinkMAC: "not-a-mac"})
	dp := &fakeDatapath{}
	a := newAgent(t, s, dp, fakeInterfaces{"uplink0": 1, "vif-web1": 5, "vif-web3": 6})
	if _, err := a.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	want, _ := datapath.CompileHosts([]intent.Node{{Name: "h2", UplinkMAC: "aa:00:00:00:00:02"}}, "h1")
	dp.mu.Lock()
	got := dp.entries.Hosts
	dp.mu.Unlock()
	if len(got) != 1 || len(want) != 1 {
		t.Fatalf("known hosts %v, want only h2 (%v): not itself, not a broken record", got, want)
	}
	for k := range want {
		if _, ok := got[k]; !ok {
			t.Fatalf("known hosts %v, want h2 %v", got, want)
		}
	}
}
