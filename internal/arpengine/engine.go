package arpengine

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ratelog"
)

// Entry is one mapping-table entry as the datapath keeps it.
type Entry struct {
	IP      netip.Addr
	HostMAC net.HardwareAddr // nil: asked for, not answered yet
	// Monotonic clock readings the datapath wrote.
	Confirmed, Used time.Duration
}

// Table is the datapath's mapping table.
type Table interface {
	Mappings() ([]Entry, error)
	Mapping(ip netip.Addr) (net.HardwareAddr, bool)
	ForgetMapping(ip netip.Addr) error
	MappingCapacity() int
}

// Config tunes the engine. Zero fields take the defaults.
type Config struct {
	HostMAC net.HardwareAddr // this host's uplink
	HostIP  netip.Addr       // its fabric address (the sender of its questions); may be invalid
	// Refresh: an entry in use is confirmed again when older than this.
	Refresh time.Duration
	// Idle: an entry unused this long is forgotten.
	Idle time.Duration
	// Wait: how long one question waits for its answer.
	Wait time.Duration
	// Tries: multicast questions before an address counts as unresolved.
	Tries int
	// Negative: how long an unresolved address is not asked for again.
	Negative time.Duration
	// Queue: packets held per address while it is resolved.
	Queue int
}

// Defaults: refresh and idle follow the paper's "periodically refreshed"
// and "timing out unused entries"; a wait of 200 ms is ample on one L2
// fabric and keeps a first packet's delay short.
const (
	DefaultRefresh  = 60 * time.Second
	DefaultIdle     = 5 * time.Minute
	DefaultWait     = 200 * time.Millisecond
	DefaultTries    = 3
	DefaultNegative = 3 * time.Second
	DefaultQueue    = 16
	// lastKnownMax bounds the memory of where forgotten entries lived.
	lastKnownMax = 1 << 16
	// maxPending bounds the addresses resolved at once (the datapath
	// already bounds the packets per address).
	maxPending = 4096
)

// Engine is the ARP engine of one host. Its methods are safe for
// concurrent use.
type Engine struct {
	cfg   Config
	table Table
	send  func(frame []byte) error
	now   func() time.Duration
	log   *slog.Logger
	rl    *ratelog.Logger // every line a VM can cause

	// observe, when set, is told of each question asked and each one
	// answered (onehop observe); called with mu held, it must not block.
	observe func(answered bool, vm netip.Addr, host net.HardwareAddr)

	mu         sync.Mutex
	pending    map[netip.Addr]*resolution
	refreshing map[netip.Addr]*probe
	negative   map[netip.Addr]time.Duration    // unresolved until
	lastKnown  map[netip.Addr]net.HardwareAddr // host of entries the table forgot
	stats      intent.ARPStats
}

// resolution is an address being looked for, with the packets waiting on it.
type resolution struct {
	held         [][]byte
	tries        int // multicast questions sent so far
	askedAt      time.Duration
	unicastTried bool // the first question went to the last known host
}

// probe is an entry in use being confirmed again.
type probe struct {
	startedAt time.Duration
	multicast bool
}

// New returns an engine; send puts a frame on the uplink, now reads the
// clock the datapath uses (CLOCK_MONOTONIC).
func New(cfg Config, table Table, send func([]byte) error, now func() time.Duration, log *slog.Logger) (*Engine, error) {
	if len(cfg.HostMAC) != 6 {
		return nil, fmt.Errorf("ARP engine: host MAC %q is not an Ethernet address", cfg.HostMAC)
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = DefaultRefresh
	}
	if cfg.Idle <= 0 {
		cfg.Idle = DefaultIdle
	}
	if cfg.Wait <= 0 {
		cfg.Wait = DefaultWait
	}
	if cfg.Tries <= 0 {
		cfg.Tries = DefaultTries
	}
	if cfg.Negative <= 0 {
		cfg.Negative = DefaultNegative
	}
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.Refresh <= cfg.Wait*time.Duration(cfg.Tries+1) {
		return nil, fmt.Errorf("ARP engine: refresh %v must exceed the %v a resolution may take", cfg.Refresh, cfg.Wait*time.Duration(cfg.Tries+1))
	}
	return &Engine{cfg: cfg, table: table, send: send, now: now, log: log, rl: ratelog.New(log, 5, time.Second, nil),
		pending: map[netip.Addr]*resolution{}, refreshing: map[netip.Addr]*probe{},
		negative: map[netip.Addr]time.Duration{}, lastKnown: map[netip.Addr]net.HardwareAddr{}}, nil
}

// Observe makes f be told of each question the engine asks (answered
// false, host the address asked: a scope's multicast or the last known
// host) and each one answered (host: where vm lives); f must not block.
// Call it before the engine runs.
func (e *Engine) Observe(f func(answered bool, vm netip.Addr, host net.HardwareAddr)) { e.observe = f }

// Hold takes a frame the datapath could not send: complete but for the
// destination host's MAC. origLen is the frame's real length; a frame cut
// short by the hand-over is not kept, but its address is still resolved.
func (e *Engine) Hold(frame []byte, origLen int) error {
	ip, err := Destination(frame)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	if until, ok := e.negative[ip]; ok && now < until {
		e.stats.Discarded++
		return nil
	}
	delete(e.negative, ip)
	if mac, ok := e.table.Mapping(ip); ok {
		// Learned between the datapath's miss and now (the datapath learns
		// the answer before this engine hears of it): what is held for ip
		// goes first, so a flow's packets (a datagram's fragments) leave
		// in the order they came.
		if r := e.pending[ip]; r != nil {
			e.resolved(ip, r, mac)
		}
		if len(frame) == origLen {
			e.release(frame, mac)
		}
		return nil
	}
	r := e.pending[ip]
	if r == nil && len(e.pending) >= maxPending {
		e.stats.Discarded++
		return nil
	}
	if r == nil {
		r = &resolution{}
		e.pending[ip] = r
		e.ask(ip, r, now)
	}
	switch {
	case len(frame) < origLen:
		e.stats.Discarded++
	case len(r.held) >= e.cfg.Queue:
		e.stats.Discarded++
	default:
		e.stats.Held++
		r.held = append(r.held, append([]byte(nil), frame...))
	}
	return nil
}

// ask sends the next question for ip: first to the host it was last known
// on, if any, then to the multicast address of its farm and subnet.
func (e *Engine) ask(ip netip.Addr, r *resolution, now time.Duration) {
	to := ScopeMAC(ip)
	if last, ok := e.lastKnown[ip]; ok && !r.unicastTried {
		// An extra first try: the multicast tries still follow.
		to, r.unicastTried = last, true
		e.stats.UnicastRequests++
	} else {
		r.tries++
		e.stats.MulticastRequests++
	}
	r.askedAt = now
	if e.observe != nil {
		e.observe(false, ip, to)
	}
	if err := e.send(Request(to, e.cfg.HostMAC, e.cfg.HostIP, ip)); err != nil {
		e.rl.Warn(logKey("send", ip), "ARP engine: cannot send question", "vm", ip, "to", to, "err", err)
	}
}

// Answered is told of an ARP reply the datapath learned and handed over:
// the packets waiting for that address go now.
func (e *Engine) Answered(a Answer) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.pending[a.VM]
	if r == nil {
		return // a refresh answer: the datapath already updated the entry
	}
	e.resolved(a.VM, r, a.HostMAC)
}

func (e *Engine) resolved(ip netip.Addr, r *resolution, mac net.HardwareAddr) {
	delete(e.pending, ip)
	delete(e.lastKnown, ip)
	e.stats.Resolved++
	if e.observe != nil {
		e.observe(true, ip, mac)
	}
	for _, f := range r.held {
		e.release(f, mac)
	}
}

func (e *Engine) release(frame []byte, mac net.HardwareAddr) {
	copy(frame[0:6], mac)
	FinishChecksum(frame)
	if err := e.send(frame); err != nil {
		e.stats.Discarded++
		e.rl.Warn("send-held", "ARP engine: cannot send held packet", "err", err)
		return
	}
	e.stats.Released++
}

// Announce tells the fabric that vm now lives on this host, so hosts that
// address it (after a move) correct their entry at once.
func (e *Engine) Announce(vm netip.Addr) {
	e.mu.Lock()
	e.stats.Announced++
	e.mu.Unlock()
	if err := e.send(Announcement(e.cfg.HostMAC, vm)); err != nil {
		e.log.Warn("ARP engine: cannot announce VM", "vm", vm, "err", err)
	}
}

// Retry asks again for addresses whose question went unanswered, and gives
// up on those out of tries. Call it a few times per Wait.
func (e *Engine) Retry() {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	for ip, r := range e.pending {
		if now-r.askedAt < e.cfg.Wait {
			continue
		}
		if mac, ok := e.table.Mapping(ip); ok {
			// A VM's own ARP for it was answered meanwhile.
			e.resolved(ip, r, mac)
			continue
		}
		if r.tries >= e.cfg.Tries {
			delete(e.pending, ip)
			e.negative[ip] = now + e.cfg.Negative
			e.stats.Unresolved++
			e.stats.Discarded += uint64(len(r.held))
			e.rl.Info(logKey("unresolved", ip), "ARP engine: no host holds this address; its packets are dropped", "vm", ip,
				"questions", r.tries, "dropped", len(r.held))
			continue
		}
		e.ask(ip, r, now)
	}
	for ip, until := range e.negative {
		if now >= until {
			delete(e.negative, ip)
		}
	}
}

// Sweep walks the mapping table once: forgets entries unused for Idle and
// questions nobody answered, confirms entries in use older than Refresh
// (unicast to their host, then multicast), and forgets those whose host no
// longer answers. Call it about once a second.
func (e *Engine) Sweep() error {
	entries, err := e.table.Mappings()
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	// seen only serves to drop probes of entries the LRU evicted: none
	// to drop, no set of every address to build.
	var seen map[netip.Addr]bool
	if len(e.refreshing) > 0 {
		seen = make(map[netip.Addr]bool, len(entries))
	}
	var errs []error
	forget := func(ip netip.Addr) {
		if ferr := e.table.ForgetMapping(ip); ferr != nil {
			errs = append(errs, ferr)
		}
		delete(e.refreshing, ip)
	}
	for _, en := range entries {
		if seen != nil {
			seen[en.IP] = true
		}
		if en.HostMAC == nil {
			// A VM's question nobody answered: keep it only as long as it
			// rate-limits that VM.
			if now-en.Confirmed > e.cfg.Negative {
				forget(en.IP)
			}
			continue
		}
		e.remember(en.IP, en.HostMAC)
		if now-en.Used > e.cfg.Idle {
			forget(en.IP)
			e.stats.Expired++
			continue
		}
		p := e.refreshing[en.IP]
		age := now - en.Confirmed
		switch {
		case age <= e.cfg.Refresh:
			if p != nil {
				delete(e.refreshing, en.IP)
				e.stats.Refreshed++
			}
		case p == nil && now-en.Used > e.cfg.Refresh:
			// Stale but not in use: confirmed when used again, or left
			// to expire.
		case p == nil:
			e.refreshing[en.IP] = &probe{startedAt: now}
			e.stats.UnicastRequests++
			e.sendOrLog(Request(en.HostMAC, e.cfg.HostMAC, e.cfg.HostIP, en.IP), en.IP)
		case !p.multicast && now-p.startedAt >= e.cfg.Wait:
			p.multicast = true
			e.stats.MulticastRequests++
			e.sendOrLog(Request(ScopeMAC(en.IP), e.cfg.HostMAC, e.cfg.HostIP, en.IP), en.IP)
		case p.multicast && now-p.startedAt >= e.cfg.Wait*time.Duration(e.cfg.Tries+1):
			forget(en.IP)
			e.stats.Lost++
			e.rl.Info(logKey("lost", en.IP), "ARP engine: the host of this VM stopped answering; entry forgotten", "vm", en.IP,
				"host", en.HostMAC)
		}
	}
	for ip := range e.refreshing {
		if seen != nil && !seen[ip] {
			delete(e.refreshing, ip) // evicted by the LRU meanwhile
		}
	}
	errs = append(errs, err)
	return errors.Join(errs...)
}

func (e *Engine) sendOrLog(frame []byte, ip netip.Addr) {
	if err := e.send(frame); err != nil {
		e.rl.Warn(logKey("send", ip), "ARP engine: cannot send question", "vm", ip, "err", err)
	}
}

func (e *Engine) remember(ip netip.Addr, mac net.HardwareAddr) {
	if cur, ok := e.lastKnown[ip]; ok && bytes.Equal(cur, mac) {
		return
	}
	// Bounded, but never below the table: a bound under it would empty
	// the memory on every walk of a full table and fill it again.
	if len(e.lastKnown) >= max(lastKnownMax, e.table.MappingCapacity()) {
		clear(e.lastKnown) // crude but bounded: only a hint is lost
	}
	e.lastKnown[ip] = append(net.HardwareAddr(nil), mac...)
}

// Stats returns what the engine did, with the table's current use.
func (e *Engine) Stats() intent.ARPStats {
	entries, _ := e.table.Mappings()
	e.mu.Lock()
	st := e.stats
	e.mu.Unlock()
	for _, en := range entries {
		if en.HostMAC == nil {
			st.Asking++
		} else {
			st.Mapped++
		}
	}
	st.Capacity = e.table.MappingCapacity()
	return st
}

// logKey is a rate-limit budget per event and subnet: addresses VMs send to
// are theirs to invent, so one subnet's flood shares one budget and cannot
// silence the lines about another's.
func logKey(event string, ip netip.Addr) string {
	b := ip.As4()
	return fmt.Sprintf("%s/%d.%d.%d", event, b[0], b[1], b[2])
}
