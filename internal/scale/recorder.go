package scale

import (
	"context"
	"fmt"
	"hash/fnv"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// Recorder is a simulated host's datapath: it implements agent.Datapath by
// remembering what the real agent asked the kernel for, and counts every
// entry a write took away (a forwarding interruption where nothing asked
// for one). Waiters registered with Await learn the moment the maps first
// satisfy them.
type Recorder struct {
	host string

	mu        sync.Mutex
	endpoints map[uint32]bool
	vis       map[datapath.VisKey]bool
	vifs      map[uint32]bool
	hosts     map[datapath.HostKey]bool
	applies   int
	removed   int // entries any Apply took away, over the whole run
	waiters   []*waiter
}

// View is what a waiter's condition may look at: the maps as last applied.
type View struct {
	Endpoints map[uint32]bool
	Vis       map[datapath.VisKey]bool
}

type waiter struct {
	cond func(View) bool
	done chan time.Time
}

func newRecorder(host string) *Recorder {
	return &Recorder{host: host, endpoints: map[uint32]bool{}, vis: map[datapath.VisKey]bool{},
		vifs: map[uint32]bool{}, hosts: map[datapath.HostKey]bool{}}
}

// AttachUplink implements agent.Datapath.
func (r *Recorder) AttachUplink(string, int) error { return nil }

// Capacity implements agent.Datapath: the kernel's default sizes would cap
// nothing the harness builds, so plenty.
func (r *Recorder) Capacity(string) int { return 1 << 20 }

// SetFeatures implements agent.Datapath.
func (r *Recorder) SetFeatures(uint32) error { return nil }

// Counters implements agent.Datapath.
func (r *Recorder) Counters() (datapath.Counters, error) {
	return datapath.Counters{Drops: map[string]uint64{}, Forwards: map[string]uint64{}}, nil
}

// Apply implements agent.Datapath: the maps become e; what e lacks of the
// previous content is counted as removed.
func (r *Recorder) Apply(e datapath.Entries, _ string) error {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.removed += replace(r.endpoints, e.Endpoints) + replace(r.vis, e.Visibility) + replace(r.vifs, e.Vifs) + replace(r.hosts, e.Hosts)
	r.applies++
	r.wakeLocked(now)
	return nil
}

// replace makes set hold exactly want's keys and returns how many it lost.
func replace[K comparable, V any](set map[K]bool, want map[K]V) int {
	lost := 0
	for k := range set {
		if _, ok := want[k]; !ok {
			delete(set, k)
			lost++
		}
	}
	for k := range want {
		set[k] = true
	}
	return lost
}

func (r *Recorder) wakeLocked(now time.Time) {
	v := View{Endpoints: r.endpoints, Vis: r.vis}
	kept := r.waiters[:0]
	for _, w := range r.waiters {
		if w.cond(v) {
			w.done <- now
		} else {
			kept = append(kept, w)
		}
	}
	r.waiters = kept
}

// await returns a channel that gets the time cond first held (at once if
// it holds now). cancel withdraws it.
func (r *Recorder) await(cond func(View) bool) (<-chan time.Time, func()) {
	w := &waiter{cond: cond, done: make(chan time.Time, 1)}
	r.mu.Lock()
	defer r.mu.Unlock()
	if cond(View{Endpoints: r.endpoints, Vis: r.vis}) {
		w.done <- time.Now()
		return w.done, func() {}
	}
	r.waiters = append(r.waiters, w)
	return w.done, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for i, x := range r.waiters {
			if x == w {
				r.waiters = append(r.waiters[:i], r.waiters[i+1:]...)
				return
			}
		}
	}
}

// stats returns the counters the report reads.
func (r *Recorder) stats() (applies, removed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.applies, r.removed
}

// hostInterfaces is a simulated host's interface table (agent.Interfaces):
// its uplink, and a vif for every name asked about, as if each VM's vif
// were already there.
type hostInterfaces struct {
	uplink string
	index  int // the host's number: its uplink MAC and address
}

// ByName implements agent.Interfaces.
func (h hostInterfaces) ByName(name string) (int, net.HardwareAddr, string, error) {
	if name == h.uplink {
		mac := net.HardwareAddr{0x02, 0x5c, 0, byte(h.index >> 16), byte(h.index >> 8), byte(h.index)}
		return 1, mac, h.address(), nil
	}
	if !strings.HasPrefix(name, intent.VifPrefix) {
		return 0, nil, "", fmt.Errorf("interface %s: not found", name)
	}
	f := fnv.New32a()
	f.Write([]byte(name))
	return 2 + int(f.Sum32()&0x3fffffff), net.HardwareAddr{0xfe, 0, 0, 0, 0, 1}, "", nil
}

// address is the host's uplink address: 172.16.0.0/12 numbered by host.
func (h hostInterfaces) address() string {
	n := h.index + 1
	return fmt.Sprintf("172.%d.%d.%d", 16+n>>16, (n>>8)&0xff, n&0xff)
}

// countingStore is the store one simulated agent sees: the real one, with
// its reads counted. The agent lists its desired keys (desired/HOST/) in
// full once at start and again only when a watch is lost, and otherwise
// applies what its event watches carry: a List of exactly its host's
// prefix is one relist. Every other read (a farm state it starts
// carrying, the node records of a relist) is counted apart, as are the
// watches it opens. The revision it applied is not the store's business:
// the agent publishes it (AgentStatus.AppliedRevision), and the harness
// reads it there.
type countingStore struct {
	store.Store
	host    string // the desired prefix of this host: intent.DesiredHostPrefix
	relists atomic.Int64
	reads   atomic.Int64 // every other List or Get
	watches atomic.Int64
}

// List implements store.Store.
func (c *countingStore) List(ctx context.Context, prefix string) (map[string][]byte, int64, error) {
	kvs, rev, err := c.Store.List(ctx, prefix)
	if err == nil {
		if prefix == c.host {
			c.relists.Add(1)
		} else {
			c.reads.Add(1)
		}
	}
	return kvs, rev, err
}

// Get implements store.Store.
func (c *countingStore) Get(ctx context.Context, key string) ([]byte, error) {
	c.reads.Add(1)
	return c.Store.Get(ctx, key)
}

// Watch implements store.Store.
func (c *countingStore) Watch(ctx context.Context, prefix string, rev int64) <-chan struct{} {
	c.watches.Add(1)
	return c.Store.Watch(ctx, prefix, rev)
}

// WatchEvents implements store.Store.
func (c *countingStore) WatchEvents(ctx context.Context, prefix string, rev int64) <-chan store.Batch {
	c.watches.Add(1)
	return c.Store.WatchEvents(ctx, prefix, rev)
}
