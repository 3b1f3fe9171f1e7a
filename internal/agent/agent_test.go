package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/testenv"
)

// fakeDatapath records what the agent asked the kernel for.
type fakeDatapath struct {
	mu       sync.Mutex
	entries  datapath.Entries
	applies  int
	uplink   string
	applyErr error
	caps     map[string]int
	bits     []uint32 // every SetFeatures, in order
}

func (f *fakeDatapath) AttachUplink(name string, _ int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.uplink = name
	return nil
}

func (f *fakeDatapath) Apply(e datapath.Entries, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.applyErr != nil {
		return f.applyErr
	}
	f.entries = e
	f.applies++
	return nil
}

// Capacity is each map's size in the fake: caps, else plenty.
func (f *fakeDatapath) Capacity(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.caps[name]; ok {
		return c
	}
	return 1 << 20
}

func (f *fakeDatapath) SetFeatures(bits uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bits = append(f.bits, bits)
	return nil
}

func (f *fakeDatapath) Counters() (datapath.Counters, error) {
	return datapath.Counters{Drops: map[string]uint64{}, Forwards: map[string]uint64{}}, nil
}

// fakeInterfaces is a host's interface table.
type fakeInterfaces map[string]int

func (f fakeInterfaces) ByName(name string) (int, net.HardwareAddr, string, error) {
	idx, ok := f[name]
	if !ok {
		return 0, nil, "", fmt.Errorf("interface %s: not found", name)
	}
	return idx, net.HardwareAddr{0xaa, 0, 0, 0, 0, byte(idx)}, "192.168.100.10", nil
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func desired() intent.Desired {
	return intent.Desired{
		Node: "h1", VMNet: "10.0.0.0/8",
		Local: []intent.LocalEndpoint{
			{Name: "blue/web/web1", IP: "10.1.1.2", MAC: "02:00:0a:01:01:02", Interface: "vif-web1"},
			{Name: "blue/web/web3", IP: "10.1.1.4", MAC: "02:00:0a:01:01:04", Interface: "vif-web3"},
		},
	}
}

func newAgent(t *testing.T, s store.Store, dp Datapath, ifs Interfaces) *Agent {
	t.Helper()
	a, err := New(Config{Node: "h1", Uplink: "uplink0"}, s, dp, ifs, quiet())
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestReconcileWritesDesiredEntriesAndReportsDigest(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	d := desired()
	putDesired(t, s, "h1", d)
	dp := &fakeDatapath{}
	a := newAgent(t, s, dp, fakeInterfaces{"uplink0": 2, "vif-web1": 5, "vif-web3": 6})

	if _, err := a.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if len(dp.entries.Endpoints) != 2 || len(dp.entries.Vifs) != 2 || dp.entries.Config.UplinkIfindex != 2 {
		t.Fatalf("entries %+v", dp.entries)
	}
	if dp.entries.Attach["vif-web1"] != 5 || dp.uplink != "uplink0" {
		t.Fatalf("attach %v uplink %q", dp.entries.Attach, dp.uplink)
	}
	st := publishedStatus(t, s, "h1")
	if st.AppliedDigest != storedDigest(t, s, "h1") || st.Endpoints != 2 || len(st.AttachedVifs) != 2 {
		t.Fatalf("status %+v", st)
	}
}

func TestVifThatAppearsLaterIsAttachedOnTheNextPass(t *testing.T) {
	s := store.NewMemory()
	putDesired(t, s, "h1", desired())
	dp := &fakeDatapath{}
	ifs := fakeInterfaces{"uplink0": 2, "vif-web1": 5}
	a := newAgent(t, s, dp, ifs)
	reconcile(t, a)
	if _, ok := dp.entries.Attach["vif-web3"]; ok {
		t.Fatal("attached a vif that does not exist")
	}
	if _, ok := dp.entries.Endpoints[datapath.IPKey(mustAddr("10.1.1.4"))]; ok {
		t.Fatal("mapping entry for a VM whose vif does not exist: it would point at a stale ifindex")
	}
	st, _, _ := a.Status()
	if len(st.MissingVifs) != 1 || st.MissingVifs[0] != "vif-web3" {
		t.Fatalf("missing %v", st.MissingVifs)
	}
	ifs["vif-web3"] = 6
	reconcile(t, a)
	if dp.entries.Attach["vif-web3"] != 6 {
		t.Fatalf("vif-web3 not attached after it appeared: %v", dp.entries.Attach)
	}
}

func TestRestartedAgentComputesTheSameEntries(t *testing.T) {
	s := store.NewMemory()
	putDesired(t, s, "h1", desired())
	ifs := fakeInterfaces{"uplink0": 2, "vif-web1": 5, "vif-web3": 6}
	first, second := &fakeDatapath{}, &fakeDatapath{}
	reconcile(t, newAgent(t, s, first, ifs))
	reconcile(t, newAgent(t, s, second, ifs))
	if fmt.Sprint(first.entries) != fmt.Sprint(second.entries) {
		t.Fatalf("a restarted agent wants different maps:\n%v\n%v", first.entries, second.entries)
	}
}

func TestMissingDesiredStateEmptiesTheTables(t *testing.T) {
	ctx := context.Background()
	dp := &fakeDatapath{}
	a := newAgent(t, store.NewMemory(), dp, fakeInterfaces{"uplink0": 2})
	if _, err := a.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if len(dp.entries.Endpoints) != 0 || dp.applies != 1 {
		t.Fatalf("entries %+v applies %d", dp.entries, dp.applies)
	}
}

func TestApplyFailureIsReportedAndCounted(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	putDesired(t, s, "h1", desired())
	dp := &fakeDatapath{applyErr: fmt.Errorf("map full")}
	a := newAgent(t, s, dp, fakeInterfaces{"uplink0": 2, "vif-web1": 5, "vif-web3": 6})
	if _, err := a.ReconcileOnce(ctx); err == nil {
		t.Fatal("reconcile hid the datapath error")
	}
	st := publishedStatus(t, s, "h1")
	if st.Error == "" || st.AppliedDigest != "" {
		t.Fatalf("status after failure %+v", st)
	}
	if _, _, failures := a.Status(); failures != 1 {
		t.Fatalf("failures %d", failures)
	}
}

func TestArrivingVMsAreAnnouncedOnce(t *testing.T) {
	s := store.NewMemory()
	d := desired()
	d.Local = d.Local[:1]
	putDesired(t, s, "h1", d)
	a := newAgent(t, s, &fakeDatapath{}, fakeInterfaces{"uplink0": 2, "vif-web1": 5, "vif-web3": 6})
	var arrived []string
	a.SetHooks(Hooks{Arrived: func(ip netip.Addr) { arrived = append(arrived, ip.String()) }})
	reconcile(t, a)
	reconcile(t, a) // nothing new: nothing announced
	putDesired(t, s, "h1", desired())
	reconcile(t, a) // web3 moved here
	if want := []string{"10.1.1.2", "10.1.1.4"}; !reflect.DeepEqual(arrived, want) {
		t.Fatalf("announced %v, want %v", arrived, want)
	}
}

func TestMissingUplinkIsAnError(t *testing.T) {
	a := newAgent(t, store.NewMemory(), &fakeDatapath{}, fakeInterfaces{})
	if _, err := a.ReconcileOnce(context.Background()); err == nil {
		t.Fatal("reconciled without an uplink")
	}
}

func TestRunRegistersNodeAndFollowsDesiredChanges(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := store.NewMemory()
	dp := &fakeDatapath{}
	a := newAgent(t, s, dp, fakeInterfaces{"uplink0": 2, "vif-web1": 5, "vif-web3": 6})
	done := make(chan error)
	go func() { done <- a.Run(ctx) }()
	testenv.Eventually(t, "the agent to register h1 with its uplink's MAC", 5*time.Second, func() bool {
		var n intent.Node
		return store.GetJSON(ctx, s, intent.NodesPrefix+"h1", &n) == nil && n.UplinkMAC == "aa:00:00:00:00:02"
	})
	putDesired(t, s, "h1", desired())
	testenv.Eventually(t, "the agent to write the desired state's 2 endpoints", 5*time.Second, func() bool {
		dp.mu.Lock()
		defer dp.mu.Unlock()
		return len(dp.entries.Endpoints) == 2
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// countingDatapath reports a drop counter that grows.
type countingDatapath struct {
	fakeDatapath
	n uint64
}

func (c *countingDatapath) Counters() (datapath.Counters, error) {
	c.n++
	return datapath.Counters{Drops: map[string]uint64{"firewall_in": c.n, "no_route": 0}, Forwards: map[string]uint64{}}, nil
}

func TestStatusCarriesNonZeroCounters(t *testing.T) {
	s := store.NewMemory()
	dp := &countingDatapath{}
	a := newAgent(t, s, dp, fakeInterfaces{"uplink0": 2})
	reconcile(t, a)
	st := publishedStatus(t, s, "h1")
	if st.Drops["firewall_in"] != 1 {
		t.Fatalf("status drops %v", st.Drops)
	}
	if _, ok := st.Drops["no_route"]; ok {
		t.Fatal("zero counters published")
	}
}

func TestADepartingVMsStaleMappingIsForgotten(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	if err := writeDesired(ctx, s, desired()); err != nil {
		t.Fatal(err)
	}
	a := newAgent(t, s, &fakeDatapath{}, fakeInterfaces{"uplink0": 2, "vif-web1": 5, "vif-web3": 6})
	var departed []string
	a.SetHooks(Hooks{Departed: func(ip netip.Addr) { departed = append(departed, ip.String()) }})
	if _, err := a.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	d := desired()
	d.Local = d.Local[:1] // web3 moves away
	if err := writeDesired(ctx, s, d); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if want := []string{"10.1.1.4"}; !reflect.DeepEqual(departed, want) {
		t.Fatalf("departed %v, want %v", departed, want)
	}
}

func TestParsePortRangeReadsTheSysctlAndRefusesNonsense(t *testing.T) {
	lo, hi, err := ParsePortRange("32768\t60999\n")
	if err != nil || lo != 32768 || hi != 60999 {
		t.Fatalf("ParsePortRange = %d, %d, %v; want 32768, 60999", lo, hi, err)
	}
	for _, bad := range []string{"", "1", "5 4", "0 10", "1 70000", "a b", "1 2 3"} {
		if _, _, err := ParsePortRange(bad); err == nil {
			t.Errorf("ParsePortRange(%q) accepted", bad)
		}
	}
}

func TestAgentRegistersEveryUplinkAndItsEphemeralRange(t *testing.T) {
	s := store.NewMemory()
	ifs := fakeInterfaces{"uplink0": 2, "uplink1": 3}
	a, err := New(Config{Node: "h1", Uplink: "uplink0", MoreUplinks: []string{"uplink1"},
		Ephemeral: func() (uint16, uint16, error) { return 40000, 50000, nil }}, s, &fakeDatapath{}, ifs, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if err := a.register(t.Context()); err != nil {
		t.Fatal(err)
	}
	var n intent.Node
	if err := store.GetJSON(t.Context(), s, intent.NodesPrefix+"h1", &n); err != nil {
		t.Fatalf("node record: %v", err)
	}
	if len(n.Uplinks) != 2 || n.Uplinks[1].Name != "uplink1" || n.Uplinks[1].Index != 1 || n.Uplinks[1].MAC != "aa:00:00:00:00:03" {
		t.Errorf("uplinks = %+v, want uplink0 and uplink1 (index 1, its MAC)", n.Uplinks)
	}
	if n.EphemeralLo != 40000 || n.EphemeralHi != 50000 {
		t.Errorf("ephemeral = %d-%d, want 40000-50000", n.EphemeralLo, n.EphemeralHi)
	}
}

// upperInterfaces is a host's interface table that can bring links up: a
// name in fail refuses once per count left.
type upperInterfaces struct {
	fakeInterfaces
	mu   sync.Mutex
	ups  []string
	fail map[string]int
}

func (u *upperInterfaces) SetUp(name string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.ups = append(u.ups, name)
	if u.fail[name] > 0 {
		u.fail[name]--
		return fmt.Errorf("bring %s up: resource busy", name)
	}
	return nil
}

// A guest interface the agent attached but could not bring up is tried
// again on the next pass, as a failed attach is, and the pass fails until
// it is up (reported, counted); once up it is left alone, as is the one
// that came up the first time.
func TestAGuestInterfaceThatFailedToComeUpIsTriedAgainOnTheNextPass(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	putDesired(t, s, "h1", desired())
	ifs := &upperInterfaces{fakeInterfaces: fakeInterfaces{"uplink0": 2, "vif-web1": 5, "vif-web3": 6}, fail: map[string]int{"vif-web3": 2}}
	a := newAgent(t, s, &fakeDatapath{}, ifs)
	ups := func() []string {
		ifs.mu.Lock()
		defer ifs.mu.Unlock()
		out := ifs.ups
		ifs.ups = nil
		return out
	}
	for pass, want := range [][]string{{"vif-web1", "vif-web3"}, {"vif-web3"}} {
		_, err := a.ReconcileOnce(ctx)
		if err == nil || !strings.Contains(err.Error(), "vif-web3") {
			t.Fatalf("pass %d: error %v, want one naming vif-web3", pass, err)
		}
		if got := ups(); !reflect.DeepEqual(got, want) {
			t.Fatalf("pass %d brought up %v, want %v", pass, got, want)
		}
		if st := publishedStatus(t, s, "h1"); !strings.Contains(st.Error, "vif-web3") {
			t.Fatalf("pass %d: status error %q, want it naming vif-web3", pass, st.Error)
		}
	}
	reconcile(t, a) // the third try succeeds: the pass does too
	if got := ups(); !reflect.DeepEqual(got, []string{"vif-web3"}) {
		t.Fatalf("third pass brought up %v, want [vif-web3]", got)
	}
	reconcile(t, a)
	if got := ups(); len(got) != 0 {
		t.Fatalf("a pass after both are up brought up %v again", got)
	}
	if _, _, failures := a.Status(); failures != 2 {
		t.Fatalf("failures %d, want the 2 passes that could not bring vif-web3 up", failures)
	}
}
