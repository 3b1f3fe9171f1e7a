package agent

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/testenv"
)

// fakeTable is a mapping table: address -> host MAC (nil: being asked for).
type fakeTable struct {
	mu sync.Mutex
	m  map[netip.Addr]net.HardwareAddr
}

func (f *fakeTable) Mapping(ip netip.Addr) (net.HardwareAddr, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	mac := f.m[ip]
	return mac, mac != nil
}

func (f *fakeTable) ForgetMapping(ip netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, ip)
	return nil
}

func (f *fakeTable) set(ip string, mac net.HardwareAddr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[mustAddr(ip)] = mac
}

// has says what the table maps ip to ("" none, "asking" a question).
func (f *fakeTable) has(ip string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	mac, ok := f.m[mustAddr(ip)]
	switch {
	case !ok:
		return ""
	case mac == nil:
		return "asking"
	}
	return mac.String()
}

var (
	purgeH2 = net.HardwareAddr{0xaa, 0, 0, 0, 0, 2}
	purgeH3 = net.HardwareAddr{0xaa, 0, 0, 0, 0, 3}
)

// purgeCloud is a store with hosts h2 and h3 and a VM record for each of
// vms ("NAME HOST IP").
func purgeCloud(t *testing.T, vms ...intent.VM) *store.Memory {
	t.Helper()
	s := store.NewMemory()
	putNodes(t, s,
		intent.Node{Name: "h2", UplinkMAC: purgeH2.String()},
		intent.Node{Name: "h3", UplinkMAC: purgeH3.String()})
	for _, v := range vms {
		putVM(t, s, v)
	}
	return s
}

func putVM(t *testing.T, s store.Store, v intent.VM) {
	t.Helper()
	if err := store.PutJSON(t.Context(), s, intent.VMsPrefix+v.FullName(), v); err != nil {
		t.Fatal(err)
	}
}

// watched makes the changes change does, then hands the purger what the
// store's watch reports of them, as Run does, one batch each.
func watched(t *testing.T, s store.Store, p *MappingPurger, rev int64, changes ...func(ctx context.Context) error) int64 {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ch := s.WatchEvents(ctx, intent.VMsPrefix, rev)
	var events []store.Event
	for _, c := range changes {
		if err := c(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for len(events) < len(changes) {
		b, ok := <-ch
		if !ok || b.Err != nil {
			t.Fatalf("watch of the VM records ended: %v", b.Err)
		}
		events = append(events, b.Events...)
	}
	if err := p.Take(ctx, events); err != nil {
		t.Fatal(err)
	}
	return events[len(events)-1].Rev
}

func vmDelete(s store.Store, v intent.VM) func(context.Context) error {
	return func(ctx context.Context) error { return s.Delete(ctx, intent.VMsPrefix+v.FullName()) }
}

func vmPut(s store.Store, v intent.VM) func(context.Context) error {
	return func(ctx context.Context) error { return store.PutJSON(ctx, s, intent.VMsPrefix+v.FullName(), v) }
}

// A VM's delete takes its learned entry out of the table, and nobody
// else's: not its host's other VMs', not an address being asked for;
// one the deleted VM's host teaches again soon after goes again; one whose
// VM left while the watch was lost goes at the list that follows. The
// first list forgets nothing: an entry of no VM's from before the agent
// followed the records is the ARP engine's to age.
func TestAMappingGoesWithItsVMAndNoOtherDoes(t *testing.T) {
	web2 := intent.NewVM("blue", "web", "web2", "h2", mustAddr("10.1.1.3"))
	web3 := intent.NewVM("blue", "web", "web3", "h2", mustAddr("10.1.1.4"))
	db1 := intent.NewVM("blue", "db", "db1", "h3", mustAddr("10.1.2.2"))
	s := purgeCloud(t, web2, web3, db1)
	table := &fakeTable{m: map[netip.Addr]net.HardwareAddr{}}
	table.set("10.1.1.3", purgeH2)
	table.set("10.1.1.4", purgeH2)
	table.set("10.1.2.2", purgeH3)
	table.set("10.1.1.9", purgeH2) // its VM was deleted before the agent started
	table.set("10.1.1.10", nil)    // a VM's question nobody answered yet
	p := NewMappingPurger(s, table, quiet())

	rev, err := p.Load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for ip, want := range map[string]string{"10.1.1.3": purgeH2.String(), "10.1.1.4": purgeH2.String(), "10.1.2.2": purgeH3.String(),
		"10.1.1.9": purgeH2.String(), "10.1.1.10": "asking"} {
		if got := table.has(ip); got != want {
			t.Errorf("after the list, %s -> %q, want %q", ip, got, want)
		}
	}

	watched(t, s, p, rev, vmDelete(s, web2))
	if got := table.has("10.1.1.3"); got != "" {
		t.Errorf("web2's entry survived its delete: -> %s", got)
	}
	for ip, want := range map[string]string{"10.1.1.4": purgeH2.String(), "10.1.2.2": purgeH3.String(), "10.1.1.10": "asking"} {
		if got := table.has(ip); got != want {
			t.Errorf("after web2's delete, %s -> %q, want %q", ip, got, want)
		}
	}
	if n := p.Purged(); n != 1 {
		t.Errorf("purged %d, want 1 (web2's)", n)
	}

	// h2 sent as web2 before it took it out, and the datapath learned it
	// again: the next recheck forgets it; after PurgeRecheck nothing
	// checks any more.
	table.set("10.1.1.3", purgeH2)
	now := time.Now()
	if err := p.Recheck(t.Context(), now); err != nil {
		t.Fatal(err)
	}
	if got := table.has("10.1.1.3"); got != "" {
		t.Errorf("web2's entry, taught again after its delete, survived the recheck: -> %s", got)
	}
	table.set("10.1.1.3", purgeH2)
	if err := p.Recheck(t.Context(), now.Add(PurgeRecheck)); err != nil {
		t.Fatal(err)
	}
	if got := table.has("10.1.1.3"); got != purgeH2.String() {
		t.Errorf("recheck after its window: 10.1.1.3 -> %q, want it left to the ARP engine", got)
	}

	// db1 goes while the watch is lost: the list after forgets it.
	if err := vmDelete(s, db1)(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Load(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := table.has("10.1.2.2"); got != "" {
		t.Errorf("db1's entry survived the list after its delete: -> %s", got)
	}
	if got := table.has("10.1.1.4"); got != purgeH2.String() {
		t.Errorf("web3's entry after the list: %q, want h2", got)
	}
	if n := p.Purged(); n != 3 {
		t.Errorf("purged %d, want 3 (web2's twice, db1's)", n)
	}
}

// A deleted address re-used by a new VM: the entry pointing at the old
// VM's host goes, the one pointing at the new VM's host stays, whether the
// new VM came in the same watch batch as the delete or after it; and no
// later recheck takes the new VM's entry.
func TestADeletedAddressReusedByANewVMKeepsOnlyTheNewVMsMapping(t *testing.T) {
	db1 := intent.NewVM("blue", "db", "db1", "h3", mustAddr("10.1.2.2"))
	db9 := intent.NewVM("blue", "db", "db9", "h3", mustAddr("10.1.2.9"))
	s := purgeCloud(t, db1, db9)
	table := &fakeTable{m: map[netip.Addr]net.HardwareAddr{}}
	table.set("10.1.2.2", purgeH3) // db1's, stale once it goes
	table.set("10.1.2.9", purgeH2) // the new VM's, learned before the delete reached this agent
	p := NewMappingPurger(s, table, quiet())
	rev, err := p.Load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	dbA := intent.NewVM("blue", "db", "dbA", "h2", mustAddr("10.1.2.2"))
	dbB := intent.NewVM("blue", "db", "dbB", "h2", mustAddr("10.1.2.9"))
	rev = watched(t, s, p, rev, vmDelete(s, db1), vmPut(s, dbA), vmDelete(s, db9), vmPut(s, dbB))
	if got := table.has("10.1.2.2"); got != "" {
		t.Errorf("the old VM's entry of a re-used address survived: -> %s", got)
	}
	if got := table.has("10.1.2.9"); got != purgeH2.String() {
		t.Errorf("the new VM's entry of a re-used address: %q, want it kept (h2)", got)
	}

	// The address of a VM deleted on its own, then re-used.
	table.set("10.1.2.2", purgeH2) // dbA's, learned
	rev = watched(t, s, p, rev, vmDelete(s, dbA))
	if got := table.has("10.1.2.2"); got != "" {
		t.Fatalf("dbA's entry survived its delete: -> %s", got)
	}
	dbC := intent.NewVM("blue", "db", "dbC", "h3", mustAddr("10.1.2.2"))
	watched(t, s, p, rev, vmPut(s, dbC))
	table.set("10.1.2.2", purgeH3) // dbC's, learned
	if err := p.Recheck(t.Context(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := table.has("10.1.2.2"); got != purgeH3.String() {
		t.Errorf("the new VM's entry after a recheck: %q, want it kept (h3)", got)
	}
	if n := p.Purged(); n != 2 {
		t.Errorf("purged %d, want 2 (db1's and dbA's entries)", n)
	}
}

// The purger on the real mapping table (the datapath's LRU hash, as the
// agent's daemon runs it): a VM's delete in the store takes its entry
// out, another VM's on the same host stays, and a re-used address keeps
// the new VM's entry.
func TestPrivilegedDeletedVMsMappingLeavesTheKernelTable(t *testing.T) {
	testenv.RequireRoot(t, "BPF maps")
	k, err := datapath.Open("", datapath.Options{})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	t.Cleanup(func() { k.Close() })
	web2 := intent.NewVM("blue", "web", "web2", "h2", mustAddr("10.1.1.3"))
	web3 := intent.NewVM("blue", "web", "web3", "h2", mustAddr("10.1.1.4"))
	db1 := intent.NewVM("blue", "db", "db1", "h3", mustAddr("10.1.2.2"))
	s := purgeCloud(t, web2, web3, db1)
	for ip, mac := range map[string]net.HardwareAddr{"10.1.1.3": purgeH2, "10.1.1.4": purgeH2, "10.1.2.2": purgeH3} {
		if err := k.PointMapping(mustAddr(ip), mac, uint64(monotonic())); err != nil {
			t.Fatal(err)
		}
	}
	mapped := func(ip string) string {
		mac, ok := k.Mapping(mustAddr(ip))
		if !ok {
			return ""
		}
		return mac.String()
	}
	p := NewMappingPurger(s, k, quiet())
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	// Its first list done, what changes after is in its watch.
	testenv.Eventually(t, "the purger to list the VM records", 10*time.Second, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.vms) == 3
	})

	if err := vmDelete(s, web2)(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "web2's entry to leave the kernel's table", 10*time.Second, func() bool { return mapped("10.1.1.3") == "" })
	dbA := intent.NewVM("blue", "db", "dbA", "h2", mustAddr("10.1.2.2"))
	if err := vmDelete(s, db1)(ctx); err != nil {
		t.Fatal(err)
	}
	if err := vmPut(s, dbA)(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "db1's entry to leave the kernel's table", 10*time.Second, func() bool { return mapped("10.1.2.2") == "" })
	if err := k.PointMapping(mustAddr("10.1.2.2"), purgeH2, uint64(monotonic())); err != nil { // dbA's, learned
		t.Fatal(err)
	}
	// A recheck (Run's, once a second, or this one) keeps what must stay.
	if err := p.Recheck(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := mapped("10.1.1.4"); got != purgeH2.String() {
		t.Errorf("web3's entry (a live VM on web2's host): %q, want h2", got)
	}
	if got := mapped("10.1.2.2"); got != purgeH2.String() {
		t.Errorf("dbA's entry (the new VM at db1's address): %q, want h2", got)
	}
	entries, err := k.Mappings()
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.IP.String())
	}
	slices.Sort(left)
	if !slices.Equal(left, []string{"10.1.1.4", "10.1.2.2"}) {
		t.Errorf("the table holds %v, want web3's and dbA's only", left)
	}
	if n := p.Purged(); n != 2 {
		t.Errorf("purged %d, want 2", n)
	}
}
