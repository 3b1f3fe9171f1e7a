package agent

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/observe"
	"github.com/onehop/onehop/internal/store"
)

// ObserveDatapath is what the observer needs of the datapath: the switch
// and bounds of its events, and its per-farm lost counts.
type ObserveDatapath interface {
	SetObserve(datapath.ObserveLimits) error
	ObserveLost() (map[uint32]uint64, error)
}

// Bounds of the agent's part of onehop observe.
const (
	// ObserveQueue is how many events wait for one stream; beyond it the
	// stream's events are counted lost (where "agent").
	ObserveQueue = 4096
	// ObserveRecent is how many of the last events (drops, while nobody
	// observes) a new stream is sent first.
	ObserveRecent = 128
	// observeFlush is how long an event may wait for others to share its
	// datagram.
	observeFlush = 50 * time.Millisecond
	// ObservePoll is how long a record may wait in the datapath's ring:
	// the datapath wakes the agent only when much is waiting (observe.h).
	ObservePoll = 100 * time.Millisecond
)

// Observer publishes this host's events to the running onehop observe
// streams (intent.ObservePrefix): it switches the datapath's flow events
// on while one runs and off when none does, and sends each stream what its
// subscription asks for, in sealed datagrams, with the counts of what was
// lost on the way.
type Observer struct {
	node string
	dp   ObserveDatapath
	log  *slog.Logger

	// tapStats reads the TAP counters (WithTap); nil: no TAP here.
	tapStats func() ([]intent.TapStats, error)

	mu     sync.Mutex
	subs   map[string]*observeSub
	recent []observe.Event
	next   int
}

// NewObserver returns the observer of host node.
func NewObserver(node string, dp ObserveDatapath, log *slog.Logger) *Observer {
	return &Observer{node: node, dp: dp, log: log, subs: map[string]*observeSub{}}
}

type observeSub struct {
	sub    observe.Subscription
	events chan observe.Event
	mu     sync.Mutex
	lost   map[uint32]uint64 // per farm, not queued since the last report
	stop   context.CancelFunc
}

// Publish hands e to every stream that wants it, never waiting: a stream
// whose queue is full counts it lost.
func (o *Observer) Publish(e observe.Event) {
	e.Node = o.node
	o.mu.Lock()
	defer o.mu.Unlock()
	if e.Kind != observe.KindLost {
		if len(o.recent) < ObserveRecent {
			o.recent = append(o.recent, e)
		} else {
			o.recent[o.next] = e
		}
		o.next = (o.next + 1) % ObserveRecent
	}
	for _, s := range o.subs {
		s.offer(e)
	}
}

func (s *observeSub) offer(e observe.Event) {
	if s.sub.Farm != 0 && e.Farm != s.sub.Farm {
		return
	}
	select {
	case s.events <- e:
	default:
		s.mu.Lock()
		s.lost[e.Farm]++
		s.mu.Unlock()
	}
}

// WithTap has o publish, each second while a stream runs, how many copies
// of each TAP policy were dropped since the last second (stats: the TAP
// feature's counters, tap.Feature.Stats). Counted from the counters rather
// than sent by the datapath: the TAP's copy walk has no stack left for an
// event (bpf/lib/tap.h), and one event a second per policy cannot crowd
// out another farm's events however hard a flood is paced.
func (o *Observer) WithTap(stats func() ([]intent.TapStats, error)) *Observer {
	o.tapStats = stats
	return o
}

// ARP publishes the ARP engine's questions and answers
// (arpengine.Engine.Observe), each of the farm of the VM asked about.
func (o *Observer) ARP(answered bool, vm netip.Addr, host net.HardwareAddr) {
	kind := observe.KindARPQuestion
	if answered {
		kind = observe.KindARPAnswer
	}
	o.Publish(observe.Event{Time: time.Now(), Kind: kind, Farm: uint32(vm.As4()[1]), Dst: vm.String(), HostMAC: host.String()})
}

// Run follows the subscriptions in st until ctx ends, and reports the
// datapath's lost events each second while a stream runs.
func (o *Observer) Run(ctx context.Context, st store.Store) {
	// A pinned switch left on by an agent that died while observed.
	if err := o.dp.SetObserve(datapath.ObserveLimits{}); err != nil {
		o.log.Warn("observe: switch flow events off", "err", err)
	}
	defer o.set(nil)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastLost, _ := o.dp.ObserveLost()
	lastTap := o.reportTap(nil)
	for ctx.Err() == nil {
		kvs, rev, err := st.List(ctx, intent.ObservePrefix)
		if err != nil {
			o.log.Warn("observe: list streams", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		o.set(kvs)
		changed := st.Watch(ctx, intent.ObservePrefix, rev)
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case <-changed: // a change, or the watch broke: list again
				break wait
			case <-tick.C:
				lastLost = o.reportLost(lastLost)
				lastTap = o.reportTap(lastTap)
			}
		}
	}
}

// reportLost publishes, per farm, the events the datapath lost since last.
func (o *Observer) reportLost(last map[uint32]uint64) map[uint32]uint64 {
	o.mu.Lock()
	active := len(o.subs) > 0
	o.mu.Unlock()
	now, err := o.dp.ObserveLost()
	if err != nil {
		o.log.Warn("observe: read lost events", "err", err)
		return last
	}
	if !active {
		return now
	}
	for farm, n := range now {
		if d := n - last[farm]; d > 0 {
			o.Publish(observe.Event{Time: time.Now(), Kind: observe.KindLost, Farm: farm, Lost: d, Where: observe.LostDatapath})
		}
	}
	return now
}

// reportTap publishes, per TAP policy, the copies dropped since last (by
// policy id; nil: read the counters only, as the baseline).
func (o *Observer) reportTap(last map[uint32]uint64) map[uint32]uint64 {
	if o.tapStats == nil {
		return nil
	}
	stats, err := o.tapStats()
	if err != nil {
		o.log.Warn("observe: read tap counters", "err", err)
		return last
	}
	now := make(map[uint32]uint64, len(stats))
	for _, st := range stats {
		now[st.ID] = st.Dropped
	}
	o.mu.Lock()
	active := len(o.subs) > 0
	o.mu.Unlock()
	if !active || last == nil {
		return now
	}
	for _, st := range stats {
		// A policy new since last (or whose slot was reused) counts from 0.
		if prev, ok := last[st.ID]; st.Dropped > prev || !ok && st.Dropped > 0 {
			o.Publish(observe.Event{Time: time.Now(), Kind: observe.KindTapDropped, Policy: st.Policy, Copies: st.Dropped - prev})
		}
	}
	return now
}

// set makes the running streams those of kvs (nil: none).
func (o *Observer) set(kvs map[string][]byte) {
	want := map[string]observe.Subscription{}
	for k, v := range kvs {
		var s observe.Subscription
		if err := json.Unmarshal(v, &s); err != nil {
			o.log.Warn("observe: stream record", "key", k, "err", err)
			continue
		}
		if s.Node != "" && s.Node != o.node {
			continue
		}
		want[s.ID] = s
	}
	o.mu.Lock()
	before := len(o.subs)
	for id, s := range o.subs {
		if _, ok := want[id]; !ok {
			s.stop()
			delete(o.subs, id)
		}
	}
	for id, s := range want {
		if o.subs[id] != nil {
			continue
		}
		conn, err := net.Dial("udp", s.Collector)
		if err != nil {
			o.log.Warn("observe: reach the stream's collector", "stream", id, "collector", s.Collector, "err", err)
			continue
		}
		ctx, stop := context.WithCancel(context.Background())
		sub := &observeSub{sub: s, events: make(chan observe.Event, ObserveQueue), lost: map[uint32]uint64{}, stop: stop}
		o.subs[id] = sub
		// What happened just before the stream started: the last drops.
		for i := range o.recent {
			sub.offer(o.recent[(o.next+i)%len(o.recent)])
		}
		go sub.send(ctx, o.node, conn, o.log)
	}
	after := len(o.subs)
	o.mu.Unlock()
	if (before == 0) != (after == 0) {
		flows := uint32(0)
		if after > 0 {
			flows = 1
		}
		if err := o.dp.SetObserve(datapath.ObserveLimits{Flows: flows}); err != nil {
			o.log.Warn("observe: switch flow events", "on", flows == 1, "err", err)
		}
	}
}

// send batches the stream's events into sealed datagrams until ctx ends,
// and reports each second what its queue could not hold.
func (s *observeSub) send(ctx context.Context, node string, conn net.Conn, log *slog.Logger) {
	defer conn.Close()
	seq := uint64(0)
	var batch []observe.Event
	size := 0
	flush := func() {
		if len(batch) == 0 {
			return
		}
		seq++
		b, err := observe.Seal(s.sub.Key, observe.Datagram{Sub: s.sub.ID, Node: node, Seq: seq, Events: batch})
		if err == nil {
			_, err = conn.Write(b)
		}
		if err != nil {
			log.Debug("observe: send", "stream", s.sub.ID, "err", err)
		}
		batch, size = nil, 0
	}
	timer := time.NewTicker(observeFlush)
	defer timer.Stop()
	lostTick := time.NewTicker(time.Second)
	defer lostTick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-s.events:
			b, _ := json.Marshal(e)
			if size+len(b) > observe.MaxDatagram-512 {
				flush()
			}
			batch = append(batch, e)
			size += len(b) + 1
		case <-timer.C:
			flush()
		case <-lostTick.C:
			s.mu.Lock()
			lost := s.lost
			s.lost = map[uint32]uint64{}
			s.mu.Unlock()
			for farm, n := range lost {
				batch = append(batch, observe.Event{Time: time.Now(), Node: node, Kind: observe.KindLost, Farm: farm, Lost: n, Where: observe.LostAgent})
			}
			flush()
		}
	}
}
