package agent

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/testenv"
)

// statusStore counts the status writes that reach the store and can refuse
// them, as a store out of quota or out of reach does.
type statusStore struct {
	store.Store
	mu      sync.Mutex
	writes  int
	refuse  bool
	refused int
}

func (s *statusStore) Put(ctx context.Context, key string, v []byte) error {
	if strings.HasPrefix(key, intent.StatusPrefix) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.refuse {
			s.refused++
			return errors.New("etcdserver: mvcc: database space exceeded")
		}
		s.writes++
	}
	return s.Store.Put(ctx, key, v)
}

func (s *statusStore) counts() (writes, refused int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes, s.refused
}

func (s *statusStore) setRefuse(on bool) {
	s.mu.Lock()
	s.refuse = on
	s.mu.Unlock()
}

// A host that sees a burst of changes writes its status at most once per
// StatusEvery (and once at the start), however many changes it applied,
// and the status it is left with names the last of them: 60 rule changes
// in a row cost a handful of writes, not 60.
func TestAStatusIsWrittenAtMostOncePerIntervalDuringABurst(t *testing.T) {
	s := &statusStore{Store: store.NewMemory()}
	ifs := fakeInterfaces{"uplink0": 2, localVM(0).Interface: 10}
	every := 300 * time.Millisecond
	a, err := New(Config{Node: "h1", Uplink: "uplink0", Resync: time.Hour, StatusEvery: every}, s, &fakeDatapath{}, ifs, quiet())
	if err != nil {
		t.Fatal(err)
	}
	putJSON(t, s, intent.DesiredVMKey("h1", localVM(0).Name), localVM(0))
	runAgent(t, a)
	testenv.Eventually(t, "the status of the first list written", 5*time.Second, func() bool { w, _ := s.counts(); return w == 1 })
	start := time.Now()
	var last int64
	for k := range 60 {
		rule := intent.VisRule{SrcFarm: 1, SrcSubnet: 1, DstFarm: 1, DstSubnet: 2, Proto: 6, Port: uint16(1000 + k)}
		putJSON(t, s, intent.FarmStateKey(1), intent.FarmState{ID: 1, Visibility: []intent.VisRule{rule}})
		_, last, _ = s.Store.List(context.Background(), intent.FarmStateKey(1))
		testenv.Eventually(t, "change applied", 5*time.Second, func() bool { st, _, _ := a.Status(); return st.AppliedRevision >= last })
		time.Sleep(5 * time.Millisecond)
	}
	burst := time.Since(start)
	testenv.Eventually(t, "the last change's revision published", 5*time.Second, func() bool { return publishedStatus(t, s, "h1").AppliedRevision == last })
	writes, _ := s.counts()
	// The first list's write, then at most one per interval begun during
	// the burst, and the trailing one that carries the last change.
	if most := 1 + int(burst/every) + 2; writes > most {
		t.Fatalf("%d status writes for 60 changes over %v, want at most %d (one per %v)", writes, burst.Round(time.Millisecond), most, every)
	}
	if writes < 2 {
		t.Fatalf("%d status writes: the changes were never reported", writes)
	}
	// The store has a write before the agent has counted it.
	testenv.Eventually(t, "the agent to count the writes the store saw", 5*time.Second, func() bool { w, _ := a.StatusWrites(); return w == uint64(writes) })
	t.Logf("60 changes over %v: %d status writes", burst.Round(time.Millisecond), writes)
}

// A status the store refuses does not fail the pass that made it (the
// datapath has the change) and is not lost: it is counted, and written
// once the store takes writes again.
func TestARefusedStatusWriteIsRetriedAndNeverFailsThePass(t *testing.T) {
	s := &statusStore{Store: store.NewMemory()}
	ifs := fakeInterfaces{"uplink0": 2, localVM(0).Interface: 10, localVM(1).Interface: 11}
	dp := &fakeDatapath{}
	a, err := New(Config{Node: "h1", Uplink: "uplink0", Resync: time.Hour, StatusEvery: 50 * time.Millisecond}, s, dp, ifs, quiet())
	if err != nil {
		t.Fatal(err)
	}
	putJSON(t, s, intent.DesiredVMKey("h1", localVM(0).Name), localVM(0))
	runAgent(t, a)
	testenv.Eventually(t, "the first status written", 5*time.Second, func() bool { w, _ := s.counts(); return w == 1 })
	s.setRefuse(true)
	putJSON(t, s, intent.DesiredVMKey("h1", localVM(1).Name), localVM(1))
	testenv.Eventually(t, "the second VM applied", 5*time.Second, func() bool { st, _, _ := a.Status(); return st.Endpoints == 2 })
	testenv.Eventually(t, "the refused write retried", 5*time.Second, func() bool { _, r := s.counts(); return r >= 2 })
	if _, _, failures := a.Status(); failures != 0 {
		t.Fatalf("%d reconcile failures: a refused status write must not fail the pass", failures)
	}
	testenv.Eventually(t, "the refusals counted as failed writes", 5*time.Second, func() bool { _, f := a.StatusWrites(); return f >= 2 })
	if got := publishedStatus(t, s, "h1"); got.Endpoints != 1 {
		t.Fatalf("published endpoints %d while the store refused, want the old 1", got.Endpoints)
	}
	s.setRefuse(false)
	testenv.Eventually(t, "the status written once the store takes writes", 5*time.Second, func() bool { return publishedStatus(t, s, "h1").Endpoints == 2 })
}

// A self-sized pace keeps the cloud's status writes near
// StatusWritesPerSecond and StatusBytesPerSecond: 100 ms for a lab of
// small hosts, 5 s at 1,000 hosts, never over 10 s; a lab of three hosts
// whose statuses list 2,000 vifs each (about 75 KiB) every 0.44 s; a set
// interval is kept whatever the size.
func TestTheStatusPaceGrowsWithTheCloudAndTheStatus(t *testing.T) {
	for _, c := range []struct {
		set         time.Duration
		hosts, size int
		want        time.Duration
	}{
		{0, 0, 0, MinStatusEvery},
		{0, 3, 2000, MinStatusEvery},
		{0, 20, 2000, MinStatusEvery},
		{0, 100, 2000, 500 * time.Millisecond},
		{0, 1000, 1000, 5 * time.Second},
		{0, 100000, 1000, MaxStatusEvery},
		{0, 3, 75 << 10, 3 * 75 * time.Second / 512},
		{0, 3, 10 << 20, MaxStatusEvery},
		{time.Second, 1000, 75 << 10, time.Second},
		{time.Millisecond, 3, 75 << 10, time.Millisecond},
	} {
		if got := statusEvery(c.set, c.hosts, c.size); got != c.want {
			t.Errorf("statusEvery(%v, %d hosts, %d bytes) = %v, want %v", c.set, c.hosts, c.size, got, c.want)
		}
	}
}

// A host that wrote nothing for a whole interval writes its next change at
// once: with an interval of an hour, the change is in the store within
// seconds, so the write did not wait for the pace (what the lab's
// readiness and `onehop status` after a single edit rely on). The change
// after it waits its hour. Driven pass by pass (no watches), so nothing
// else the agent does can start the pace's timer behind the test's back.
func TestAQuietHostWritesItsNextChangeAtOnce(t *testing.T) {
	s := &statusStore{Store: store.NewMemory()}
	ifs := fakeInterfaces{"uplink0": 2, localVM(0).Interface: 10, localVM(1).Interface: 11}
	a, err := New(Config{Node: "h1", Uplink: "uplink0", Resync: time.Hour, StatusEvery: time.Hour}, s, &fakeDatapath{}, ifs, quiet())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	published := make(chan struct{})
	t.Cleanup(func() { cancel(); <-published })
	putJSON(t, s, intent.DesiredVMKey("h1", localVM(0).Name), localVM(0))
	reconcile(t, a) // written at once, before it returns
	if w, _ := s.counts(); w != 1 {
		t.Fatalf("%d status writes after a full list, want 1", w)
	}
	a.publishedAt = time.Now().Add(-2 * time.Hour) // the hour since has passed
	go func() {
		defer close(published)
		a.publishStatuses(ctx)
	}()
	putJSON(t, s, intent.DesiredVMKey("h1", localVM(1).Name), localVM(1))
	if _, err := a.relist(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the quiet host's change written without waiting for its interval", 5*time.Second, func() bool { return publishedStatus(t, s, "h1").Endpoints == 2 })
	testenv.Eventually(t, "the write counted", 5*time.Second, func() bool { w, _ := a.StatusWrites(); return w == 2 })
	if err := s.Delete(ctx, intent.DesiredVMKey("h1", localVM(0).Name)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.relist(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := a.Status(); st.Endpoints != 1 {
		t.Fatalf("endpoints %d after the third change, want 1", st.Endpoints)
	}
	time.Sleep(200 * time.Millisecond) // what an unpaced write would take, many times over
	if w, _ := s.counts(); w != 2 || publishedStatus(t, s, "h1").Endpoints != 2 {
		t.Fatalf("%d status writes, want 2: a change right after a write waits for the interval", w)
	}
}
