package agent

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/observe"
)

// quietDatapath is an ObserveDatapath that loses nothing.
type quietDatapath struct{}

func (quietDatapath) SetObserve(datapath.ObserveLimits) error { return nil }
func (quietDatapath) ObserveLost() (map[uint32]uint64, error) { return nil, nil }

// tapCounters are TAP counters a test moves.
type tapCounters struct {
	mu    sync.Mutex
	stats []intent.TapStats
}

func (c *tapCounters) read() ([]intent.TapStats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]intent.TapStats(nil), c.stats...), nil
}

func (c *tapCounters) set(stats ...intent.TapStats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats = stats
}

// collector is a stream's end: it reads the observer's datagrams.
func collector(t *testing.T, farm uint32) (observe.Subscription, *net.UDPConn) {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return observe.Subscription{ID: conn.LocalAddr().String(), Collector: conn.LocalAddr().String(), Key: []byte("k"), Farm: farm}, conn
}

// received reads what conn got until it has been quiet for a while.
func received(t *testing.T, sub observe.Subscription, conn *net.UDPConn) []observe.Event {
	t.Helper()
	var out []observe.Event
	buf := make([]byte, observe.MaxDatagram)
	for {
		conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		n, err := conn.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		d, err := observe.Open(sub.Key, buf[:n])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d.Events...)
	}
}

// TAP copies lost to pacing show in observe as one event per policy and
// second, with how many: counted from the TAP counters' deltas (the copy
// walk has no stack for a datapath event). They belong to no farm: an
// operator's stream shows them, a tenant's (farm 1) does not, since it
// must not learn that its traffic is copied; counters that did not move
// publish nothing, and drops from before a stream are not reported to it.
func TestTapCopiesDroppedByPacingAreObserveEventsOfNoFarm(t *testing.T) {
	c := &tapCounters{}
	c.set(intent.TapStats{Policy: "spy", ID: 3, Dropped: 500}, intent.TapStats{Policy: "quiet", ID: 4, Dropped: 7})
	o := NewObserver("h1", quietDatapath{}, slog.New(slog.DiscardHandler)).WithTap(c.read)
	base := o.reportTap(nil)

	admin, adminConn := collector(t, 0)
	tenant, tenantConn := collector(t, 1)
	kvs := map[string][]byte{}
	for _, s := range []observe.Subscription{admin, tenant} {
		b, _ := json.Marshal(s)
		kvs[s.ID] = b
	}
	o.set(kvs)
	t.Cleanup(func() { o.set(nil) })

	c.set(intent.TapStats{Policy: "spy", ID: 3, Dropped: 742}, intent.TapStats{Policy: "quiet", ID: 4, Dropped: 7},
		intent.TapStats{Policy: "new", ID: 5, Dropped: 2})
	last := o.reportTap(base)
	o.reportTap(last) // nothing moved since

	got := map[string]observe.Event{}
	for _, e := range received(t, admin, adminConn) {
		if e.Kind == observe.KindTapDropped {
			if _, dup := got[e.Policy]; dup {
				t.Errorf("policy %s reported twice: %+v", e.Policy, e)
			}
			got[e.Policy] = e
		}
	}
	for policy, want := range map[string]uint64{"spy": 242, "new": 2} {
		e := got[policy]
		if e.Copies != want || e.Farm != 0 || e.Node != "h1" {
			t.Errorf("policy %s: event %+v, want %d copies dropped, farm 0, node h1", policy, e, want)
		}
	}
	if e, ok := got["quiet"]; ok || len(got) != 2 {
		t.Errorf("events for %v (quiet: %+v): want spy's and new's only", got, e)
	}
	for _, e := range received(t, tenant, tenantConn) {
		if e.Kind == observe.KindTapDropped {
			t.Errorf("a tenant's stream got a TAP event: %+v", e)
		}
	}
}
