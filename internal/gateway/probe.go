package gateway

import (
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/lisp"
)

// controlPort is where an xTR answers probes from.
const controlPort = lisp.ControlPort

// RLOC probing (RFC 9301 §7.1): the gateway sends a Map-Request with the P
// bit to every locator its connections use, over the path that reaches it,
// and the xTR owning the locator answers with a Map-Reply with the P bit
// and the nonce echoed. A locator that misses Misses probes in a row is
// down for that path (its subflows are closed, as when the gateway's own
// link goes down); one answered probe brings it back. This notices a path
// that fails beyond the gateway's link, which link state cannot.

// Defaults of the probe flags.
const (
	DefaultProbeInterval = time.Second
	DefaultProbeMisses   = 3
	// MinProbeInterval keeps probing from becoming a flood.
	MinProbeInterval = 100 * time.Millisecond
	// MaxProbeMisses is the longest tolerance Validate admits.
	MaxProbeMisses = 100
	// MaxProbed bounds the (path, locator) pairs probed at once.
	MaxProbed = 256
)

// ProbeKey is one locator as seen over one path.
type ProbeKey struct {
	Path int
	RLOC netip.Addr
}

// Probe is one probe due: send a probe for EID with Nonce to Key.RLOC over
// Key.Path.
type Probe struct {
	Key   ProbeKey
	EID   netip.Prefix
	Nonce uint64
}

// ProbeChange is a locator going down (missed probes) or up (answered, or
// forgotten).
type ProbeChange struct {
	Key ProbeKey
	Up  bool
}

// RLOCProbe is one probed locator as status shows it.
type RLOCProbe struct {
	RLOC     netip.Addr `json:"rloc"`
	Up       bool       `json:"up"`
	Missed   int        `json:"missed"`
	Sent     uint64     `json:"sent"`
	Answered uint64     `json:"answered"`
	// RTT is the last answered probe's round trip.
	RTT time.Duration `json:"rtt_ns,omitempty"`
}

// Prober is the probing state machine (pure: the caller sends, receives and
// applies the changes; the clock and the nonces are injected).
type Prober struct {
	interval time.Duration
	misses   int
	idle     time.Duration
	now      func() time.Time
	nonce    func() uint64

	mu       sync.Mutex
	entries  map[ProbeKey]*probeEntry
	counters map[string]uint64
}

type probeEntry struct {
	eid         netip.Prefix
	watched     time.Time
	next        time.Time
	nonce       uint64
	sentAt      time.Time
	outstanding bool
	missed      int
	down        bool
	rtt         time.Duration
	sent        uint64
	answered    uint64
}

// ProbeCounterNames are the counters a Prober keeps (all present from the
// start, so a reader never mistakes absent for zero).
var ProbeCounterNames = []string{"probe_sent", "probe_answered", "probe_missed", "probe_bad_nonce", "probe_bad_source", "probe_not_a_reply", "probe_untracked"}

// NewProber probes every interval and marks a locator down after misses
// unanswered probes in a row; a locator no connection has used for a while
// (30 intervals, at least a minute) is forgotten, and up again.
func NewProber(interval time.Duration, misses int, now func() time.Time, nonce func() uint64) *Prober {
	c := map[string]uint64{}
	for _, n := range ProbeCounterNames {
		c[n] = 0
	}
	return &Prober{interval: interval, misses: misses, idle: max(30*interval, time.Minute), now: now, nonce: nonce,
		entries: map[ProbeKey]*probeEntry{}, counters: c}
}

// Watch says a connection uses k for eid now; a new locator is probed at
// the next Tick.
func (p *Prober) Watch(k ProbeKey, eid netip.Prefix) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if e := p.entries[k]; e != nil {
		e.watched = now
		if eid.Bits() > e.eid.Bits() || !e.eid.IsValid() {
			e.eid = eid
		}
		return
	}
	if len(p.entries) >= MaxProbed {
		p.counters["probe_untracked"]++
		return
	}
	p.entries[k] = &probeEntry{eid: eid, watched: now, next: now}
}

// Tick returns the probes due now and the locators that changed: a probe
// still unanswered when the next one is due is a miss, and the Misses-th
// miss in a row takes its locator down.
func (p *Prober) Tick() ([]Probe, []ProbeChange) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	var probes []Probe
	var changes []ProbeChange
	for k, e := range p.entries {
		if now.Sub(e.watched) > p.idle {
			delete(p.entries, k)
			if e.down {
				changes = append(changes, ProbeChange{Key: k, Up: true})
			}
			continue
		}
		if now.Before(e.next) {
			continue
		}
		if e.outstanding {
			e.missed++
			p.counters["probe_missed"]++
			if e.missed >= p.misses && !e.down {
				e.down = true
				changes = append(changes, ProbeChange{Key: k, Up: false})
			}
		}
		e.nonce, e.sentAt, e.outstanding = p.nonce(), now, true
		e.next = now.Add(p.interval)
		e.sent++
		p.counters["probe_sent"]++
		probes = append(probes, Probe{Key: k, EID: e.eid, Nonce: e.nonce})
	}
	sort.Slice(probes, func(i, j int) bool { return lessKey(probes[i].Key, probes[j].Key) })
	sort.Slice(changes, func(i, j int) bool { return lessKey(changes[i].Key, changes[j].Key) })
	return probes, changes
}

func lessKey(a, b ProbeKey) bool {
	if a.Path != b.Path {
		return a.Path < b.Path
	}
	return a.RLOC.Less(b.RLOC)
}

// NotAReply counts a datagram on a probe socket that is not a Map-Reply
// with the P bit.
func (p *Prober) NotAReply() {
	p.mu.Lock()
	p.counters["probe_not_a_reply"]++
	p.mu.Unlock()
}

// Answer takes a probe reply with nonce that arrived from src on path's
// socket. It counts and ignores a reply from anything but a probed
// locator's control port over that path (probe_bad_source) and one whose
// nonce is not the outstanding probe's (probe_bad_nonce: a late answer, or
// a forgery). A good answer clears the misses; when the locator was down it
// returns its change to up.
func (p *Prober) Answer(path int, src netip.AddrPort, nonce uint64) (ProbeChange, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := ProbeKey{Path: path, RLOC: src.Addr().Unmap()}
	e := p.entries[k]
	if e == nil || src.Port() != controlPort {
		p.counters["probe_bad_source"]++
		return ProbeChange{}, false
	}
	if !e.outstanding || nonce != e.nonce {
		p.counters["probe_bad_nonce"]++
		return ProbeChange{}, false
	}
	e.outstanding, e.missed = false, 0
	e.rtt = p.now().Sub(e.sentAt)
	e.answered++
	p.counters["probe_answered"]++
	if e.down {
		e.down = false
		return ProbeChange{Key: k, Up: true}, true
	}
	return ProbeChange{}, false
}

// Down says whether k is down.
func (p *Prober) Down(k ProbeKey) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.entries[k]
	return e != nil && e.down
}

// Status lists the locators probed over path, by address.
func (p *Prober) Status(path int) []RLOCProbe {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []RLOCProbe
	for k, e := range p.entries {
		if k.Path == path {
			out = append(out, RLOCProbe{RLOC: k.RLOC, Up: !e.down, Missed: e.missed, Sent: e.sent, Answered: e.answered, RTT: e.rtt})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].RLOC.Less(out[j].RLOC) })
	return out
}

// Counters returns a copy of the prober's counters.
func (p *Prober) Counters() map[string]uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]uint64, len(p.counters))
	for k, v := range p.counters {
		out[k] = v
	}
	return out
}
