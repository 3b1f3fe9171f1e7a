package agent

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/testenv"
)

// watchedStore records what an agent lists and watches, and can break its
// watches as a compacted revision or a lost connection does.
type watchedStore struct {
	store.Store
	mu       sync.Mutex
	lists    map[string]int
	watches  []string
	breakers []chan struct{}
}

func newWatchedStore() *watchedStore {
	return &watchedStore{Store: store.NewMemory(), lists: map[string]int{}}
}

func (w *watchedStore) List(ctx context.Context, prefix string) (map[string][]byte, int64, error) {
	w.mu.Lock()
	w.lists[prefix]++
	w.mu.Unlock()
	return w.Store.List(ctx, prefix)
}

func (w *watchedStore) WatchEvents(ctx context.Context, prefix string, rev int64) <-chan store.Batch {
	brk := make(chan struct{})
	w.mu.Lock()
	w.watches = append(w.watches, prefix)
	w.breakers = append(w.breakers, brk)
	w.mu.Unlock()
	in := w.Store.WatchEvents(ctx, prefix, rev)
	out := make(chan store.Batch)
	go func() {
		defer close(out)
		for {
			select {
			case b, ok := <-in:
				if !ok {
					return
				}
				select {
				case out <- b:
				case <-ctx.Done():
					return
				}
			case <-brk:
				select {
				case out <- store.Batch{Err: store.ErrCompacted}:
				case <-ctx.Done():
				}
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// breakWatches ends every watch open now with ErrCompacted.
func (w *watchedStore) breakWatches() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, b := range w.breakers {
		close(b)
	}
	w.breakers = nil
}

func (w *watchedStore) listsOf(prefix string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lists[prefix]
}

func (w *watchedStore) watched() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.watches...)
}

// localVM is VM i of farm 1 on h1, with its vif.
func localVM(i int) intent.LocalEndpoint {
	ip := fmt.Sprintf("10.1.%d.%d", 1+i/200, 2+i%200)
	return intent.LocalEndpoint{Name: fmt.Sprintf("blue/s%d/vm%d", 1+i/200, i), IP: ip, MAC: "02:00:0a:01:01:02",
		Interface: fmt.Sprintf("vif-vm%d", i)}
}

func putJSON(t *testing.T, s store.Store, key string, v any) {
	t.Helper()
	if err := store.PutJSON(context.Background(), s, key, v); err != nil {
		t.Fatal(err)
	}
}

func runAgent(t *testing.T, a *Agent) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// An agent lists its desired state once, then applies what its watches
// carry, change by change: 30 VMs arriving one by one and a rule of their
// farm cost no further list. It watches its own keys, the node records and
// the state of the one farm it carries: another host's VMs and another
// farm's rules never reach it.
func TestAgentAppliesChangesFromItsWatchWithoutRelisting(t *testing.T) {
	s := newWatchedStore()
	ifs := fakeInterfaces{"uplink0": 2}
	for i := range 30 {
		ifs[localVM(i).Interface] = 10 + i
	}
	dp := &fakeDatapath{}
	a, err := New(Config{Node: "h1", Uplink: "uplink0", Resync: time.Hour}, s, dp, ifs, quiet())
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	endpoints := func(n int) func() bool {
		return func() bool {
			st, _, _ := a.Status()
			return st.Endpoints == n
		}
	}
	for i := range 30 {
		putJSON(t, s, intent.DesiredVMKey("h1", localVM(i).Name), localVM(i))
	}
	testenv.Eventually(t, "the agent to apply 30 VMs", 5*time.Second, endpoints(30))
	putJSON(t, s, intent.DesiredVMKey("h2", "blue/s1/elsewhere"), intent.LocalEndpoint{Name: "blue/s1/elsewhere", IP: "10.1.1.250"})
	putJSON(t, s, intent.FarmStateKey(7), intent.FarmState{ID: 7, Visibility: []intent.VisRule{{SrcFarm: 7, SrcSubnet: 1, DstFarm: 7, DstSubnet: 2}}})
	rule := intent.VisRule{SrcFarm: 1, SrcSubnet: 1, DstFarm: 1, DstSubnet: 2, Proto: 6, Port: 80}
	putJSON(t, s, intent.FarmStateKey(1), intent.FarmState{ID: 1, Visibility: []intent.VisRule{rule}})
	_, ruleRev, _ := s.Store.List(context.Background(), intent.FarmStateKey(1))
	testenv.Eventually(t, "the agent to apply farm 1's rule", 5*time.Second, func() bool {
		dp.mu.Lock()
		defer dp.mu.Unlock()
		return len(dp.entries.Visibility) == 1
	})
	testenv.Eventually(t, "the status to report the rule's revision as applied", 5*time.Second, func() bool {
		st, _, _ := a.Status()
		return st.AppliedRevision >= ruleRev
	})
	if lists, relists := a.Lists(); lists != 1 || relists != 0 {
		t.Fatalf("the agent listed its desired state %d times (%d after a lost watch), want once", lists, relists)
	}
	if n := s.listsOf(intent.DesiredHostPrefix("h1")); n != 1 {
		t.Fatalf("the agent listed its keys %d times, want once", n)
	}
	for _, p := range s.watched() {
		for _, other := range []string{intent.DesiredVMKey("h2", "blue/s1/elsewhere"), intent.FarmStateKey(7)} {
			if strings.HasPrefix(other, p) {
				t.Errorf("the agent watches %s, which carries %s (not its host's)", p, other)
			}
		}
	}
	if st, _, _ := a.Status(); st.Endpoints != 30 {
		t.Fatalf("endpoints %d, want 30 (h2's VM is not h1's)", st.Endpoints)
	}
}

// A lost watch (a compacted revision) makes the agent list again, once,
// and what changed while it was not watching is applied.
func TestAgentRelistsOnlyWhenItsWatchIsLost(t *testing.T) {
	s := newWatchedStore()
	ifs := fakeInterfaces{"uplink0": 2}
	for i := range 3 {
		ifs[localVM(i).Interface] = 10 + i
	}
	dp := &fakeDatapath{}
	a, err := New(Config{Node: "h1", Uplink: "uplink0", Resync: time.Hour}, s, dp, ifs, quiet())
	if err != nil {
		t.Fatal(err)
	}
	putJSON(t, s, intent.DesiredVMKey("h1", localVM(0).Name), localVM(0))
	runAgent(t, a)
	testenv.Eventually(t, "the first VM applied", 5*time.Second, func() bool { st, _, _ := a.Status(); return st.Endpoints == 1 })
	// The agent opens its watches after it applied its list: break them
	// once they are open (the nodes' is opened after the host's).
	testenv.Eventually(t, "the agent watching", 5*time.Second, func() bool { return slices.Contains(s.watched(), intent.NodesPrefix) })
	s.breakWatches()
	putJSON(t, s, intent.DesiredVMKey("h1", localVM(1).Name), localVM(1))
	putJSON(t, s, intent.DesiredVMKey("h1", localVM(2).Name), localVM(2))
	// The watch may bring the writes before it reports its end: wait for
	// the list that follows it too.
	testenv.Eventually(t, "the VMs written around the break applied and listed again", 5*time.Second, func() bool {
		st, _, _ := a.Status()
		lists, _ := a.Lists()
		return st.Endpoints == 3 && lists >= 2
	})
	if lists, relists := a.Lists(); lists != 2 || relists != 1 {
		t.Fatalf("lists %d, relists %d: want 2 and 1", lists, relists)
	}
}

// maxLineBytes is the most one agent log line may take, whatever the
// number of VMs (before, a line listed every vif by name).
const maxLineBytes = 1024

// No line an agent logs grows with its VMs: 3,000 VMs arriving with most
// vifs missing, the vifs appearing, and 1,000 VMs leaving are each logged
// as counts and a few names.
func TestALogLineStaysSmallWithManyVMs(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	s := store.NewMemory()
	ifs := fakeInterfaces{"uplink0": 2}
	d := intent.Desired{Node: "h1"}
	for i := range 3000 {
		d.Local = append(d.Local, localVM(i))
		if i%10 == 0 {
			ifs[localVM(i).Interface] = 10 + i
		}
	}
	putDesired(t, s, "h1", d)
	a, err := New(Config{Node: "h1", Uplink: "uplink0"}, s, &fakeDatapath{}, ifs, log)
	if err != nil {
		t.Fatal(err)
	}
	reconcile(t, a)
	for i := range 3000 {
		ifs[localVM(i).Interface] = 10 + i
	}
	reconcile(t, a)
	d.Local = d.Local[:2000]
	putDesired(t, s, "h1", d)
	reconcile(t, a)
	if st, _, _ := a.Status(); st.Endpoints != 2000 {
		t.Fatalf("endpoints %d, want 2000", st.Endpoints)
	}
	lines, longest := 0, 0
	sc := bufio.NewScanner(&buf)
	sc.Buffer(nil, 1<<24)
	var sawWaiting, sawApplied bool
	for sc.Scan() {
		lines++
		l := sc.Text()
		longest = max(longest, len(l))
		if len(l) > maxLineBytes {
			t.Errorf("a log line of %d bytes (over %d): %.300s...", len(l), maxLineBytes, l)
		}
		sawWaiting = sawWaiting || strings.Contains(l, "waiting for vifs")
		sawApplied = sawApplied || strings.Contains(l, "datapath reconciled")
	}
	if !sawWaiting || !sawApplied {
		t.Fatalf("the log says nothing of the missing vifs (%v) or of the changes applied (%v): %d lines", sawWaiting, sawApplied, lines)
	}
	t.Logf("%d lines, the longest %d bytes", lines, longest)
}

// A restarted agent whose host changed nothing does not write its node
// record again: every other agent watches those records.
func TestARestartedAgentLeavesAnUnchangedNodeRecordAlone(t *testing.T) {
	s := store.NewMemory()
	ifs := fakeInterfaces{"uplink0": 2}
	for range 2 {
		a, err := New(Config{Node: "h1", Uplink: "uplink0", Resync: time.Hour}, s, &fakeDatapath{}, ifs, quiet())
		if err != nil {
			t.Fatal(err)
		}
		if err := a.register(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Writes(); n != 1 {
		t.Fatalf("two starts wrote %d times, want once", n)
	}
}
