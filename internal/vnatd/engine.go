// Package vnatd is the VNAT endpoint daemon (`onehop vnat run`, issue 10):
// it keeps every connection's migration state (internal/vcmp's role
// machine), answers VCMP on TCP 2031, and when the endpoint's address
// changes restores its connections the paper's way (§3.3.2): locate the
// peer, exchange keyed updates in one batch per peer, install the
// translations (internal/vnat).
//
// engine.go is pure: no kernel, no sockets. The kernel and the network come
// in through Translator and Dialer, so the restore flow is tested with fakes
// (engine_test.go); kernel.go and run.go are the thin adapters.
package vnatd

import (
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/onehop/onehop/internal/vcmp"
)

// Mapping is one connection's translation: its virtual tuple (its first
// physical one, never changing) and the physical tuple it travels as now,
// both seen from this end.
type Mapping struct {
	Virtual, Physical vcmp.Tuple
	// Closed (from Conns): translated, but no socket holds it any more.
	Closed bool
}

// Translator is the endpoint's datapath, as the engine needs it.
type Translator interface {
	// Conns lists the connections open at this end now (virtual and
	// physical tuples; equal unless migrated).
	Conns() ([]Mapping, error)
	// Translate installs the mappings (one batched map update).
	Translate([]Mapping) error
	// Accept installs only the ingress half of the mappings (packets
	// arriving at the new physical tuple reach the socket; what it sends
	// is not translated yet), all or nothing; Translate or Unaccept end it.
	Accept([]Mapping) error
	// Unaccept withdraws what Accept installed for these connections.
	Unaccept(virtual []vcmp.Tuple) error
	// KeepLocal keeps addr usable by the sockets bound to it after the
	// interface lost it, unannounced.
	KeepLocal(addr netip.Addr) error
	// Forget stops translating a connection (it closed).
	Forget(virtual vcmp.Tuple) error
}

// Dialer opens a VCMP stream to the daemon at addr (port vcmp.Port).
type Dialer func(ctx context.Context, addr netip.Addr) (io.ReadWriteCloser, error)

// Config is what the engine needs besides its adapters.
type Config struct {
	// LocationServers are asked last on every locate walk (paper P(3)/S(3)).
	LocationServers []netip.Addr
	// RequireKeys refuses unauthenticated updates (--require-keys).
	RequireKeys bool
	// Logger; nil is slog.Default().
	Logger *slog.Logger
	// Now; nil is time.Now (the log limiter's and retries' clock).
	Now func() time.Time
	// RetryFor is how long a locate walk that reached nobody is retried
	// before the migration is aborted; 0 is 15 s.
	RetryFor time.Duration
	// Helpers run for each connection whose peer is away (helpers.go).
	Helpers []Helper
	// SuspRetry is the pause before a suspend claim is sent again to a
	// peer that did not answer (doubling, SuspTries in all); 0 is 250 ms.
	SuspRetry time.Duration
	// SuspTimeout is how long one claim waits for its answer; 0 is 2 s.
	SuspTimeout time.Duration
	// Conflict is the default conflict policy (--conflict); "" is abort.
	Conflict Conflict
	// OnRestore, if set, is told how long each Restore took.
	OnRestore func(time.Duration)
	// Keys, if set, keeps the agreed keys across a restart (keys.go):
	// saved whenever they change, loaded with LoadKeys.
	Keys KeyStore
}

// MaxRecords caps the location records one daemon keeps for others.
const MaxRecords = 65536

// conn is one connection's daemon state.
type conn struct {
	m    *vcmp.Conn
	phys vcmp.Tuple // where it travels now, seen from this end
	// oldLocal, oldRemote: the physical addresses before the move being
	// restored (the locate walk's places).
	oldLocal, oldRemote netip.Addr
	priv                *ecdh.PrivateKey  // this suspension's key pair
	own                 [vcmp.KeyLen]byte // its public key (kept when priv is not: LoadKeys)
	peerPub             *[vcmp.KeyLen]byte
	keys                *vcmp.Keys
	keyTries            int // AgreeKeys asked the peer this many times
	sendSeq             uint64
	win                 vcmp.Window
	helping             bool     // the helpers run for it (its peer is away)
	conflict            Conflict // its §3.4.2 policy; default: the daemon's
	// keysDirty is the engine's flag: set when what the key file keeps
	// of this connection changed.
	keysDirty *bool
}

// Engine is the daemon's state and decisions.
type Engine struct {
	cfg  Config
	tr   Translator
	dial Dialer
	log  *slog.Logger

	mu       sync.Mutex
	conns    map[vcmp.Tuple]*conn
	dir      *vcmp.Directory
	counters map[string]uint64
	limit    map[string]*logLimit
	// self are addresses that are this endpoint's (old and new): a walk
	// never asks itself.
	self map[netip.Addr]bool
	// stop, when set, ends the daemon on a control "stop" request.
	stop func()
	// report is the last restore's (report.go).
	report lastRestore
	// keys keeps the agreed keys (Config.Keys; nil after DropKeys);
	// keysDirty says they changed since it last saved them.
	keys      KeyStore
	keysDirty bool
}

// OnStop makes a control "stop" request call f (the daemon's clean stop).
func (e *Engine) OnStop(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stop = f
}

// New is an engine over a datapath and a network.
func New(cfg Config, tr Translator, dial Dialer) *Engine {
	e := &Engine{cfg: cfg, tr: tr, dial: dial, log: cfg.Logger, conns: map[vcmp.Tuple]*conn{},
		counters: map[string]uint64{}, limit: map[string]*logLimit{}, self: map[netip.Addr]bool{}, keys: cfg.Keys}
	if e.log == nil {
		e.log = slog.Default()
	}
	if e.cfg.Now == nil {
		e.cfg.Now = time.Now
	}
	if e.cfg.RetryFor == 0 {
		e.cfg.RetryFor = 15 * time.Second
	}
	if e.cfg.SuspRetry == 0 {
		e.cfg.SuspRetry = 250 * time.Millisecond
	}
	if e.cfg.SuspTimeout == 0 {
		e.cfg.SuspTimeout = 2 * time.Second
	}
	// A place answers for the ends it holds: the peer that never moved is
	// found at its old place on the first query.
	e.dir = vcmp.NewDirectory(func(t vcmp.Tuple) (netip.AddrPort, bool) {
		if c, ok := e.conns[t]; ok && c.m.State != vcmp.Aborted {
			return c.phys.Local, true
		}
		return netip.AddrPort{}, false
	})
	return e
}

// isVCMP: the daemons' own streams are never migrated.
func isVCMP(t vcmp.Tuple) bool {
	return t.Local.Port() == vcmp.Port || t.Remote.Port() == vcmp.Port
}

// Sync reads the open connections from the datapath: new ones are recorded
// active, closed ones that never moved are forgotten.
func (e *Engine) Sync() error {
	ms, err := e.tr.Conns()
	if err != nil {
		return fmt.Errorf("vnatd: list connections: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	seen := map[vcmp.Tuple]bool{}
	for _, m := range ms {
		if isVCMP(m.Virtual) || m.Closed {
			continue
		}
		seen[m.Virtual] = true
		if _, ok := e.conns[m.Virtual]; !ok {
			c := &conn{m: vcmp.NewConn(m.Virtual), phys: m.Physical, keysDirty: &e.keysDirty}
			if m.Physical != m.Virtual {
				// Translated before this daemon knew it: an earlier
				// run's, taken over from the pinned maps. A port it
				// travels from instead of its own is held again (the
				// earlier run's hold ended with it).
				c.m.State = vcmp.Migrated
				if ports, ok := e.tr.(Ports); ok && m.Physical.Local.Port() != m.Virtual.Local.Port() {
					if err := ports.Hold(m.Virtual, m.Physical.Local); err != nil {
						e.warn("port_errors", "vnat: hold the port of a taken-over translation", "conn", m.Virtual, "port", m.Physical.Local, "err", err)
					}
				}
			}
			e.conns[m.Virtual] = c
		}
	}
	// A connection no socket holds any more is forgotten, its translation
	// too; one being located is left to finish its walk.
	var errs []error
	for t, c := range e.conns {
		if seen[t] || c.m.State == vcmp.Locating {
			continue
		}
		e.stopHelpers(c)
		if ports, ok := e.tr.(Ports); ok {
			if err := ports.Release(t); err != nil {
				errs = append(errs, fmt.Errorf("vnatd: release the port of closed %v: %w", t, err))
			}
		}
		if c.m.State != vcmp.Active {
			if err := e.tr.Forget(t); err != nil {
				errs = append(errs, fmt.Errorf("vnatd: forget closed %v: %w", t, err))
				continue
			}
			e.counters["closed_forgotten"]++
		}
		if c.keys != nil {
			e.keysDirty = true // its keys leave the key file
		}
		delete(e.conns, t)
		e.dir.Forget(t)
	}
	e.saveKeys()
	return errors.Join(errs...)
}

// ConnStatus is one connection as `onehop vnat status` shows it.
type ConnStatus struct {
	Proto    string `json:"proto"`
	Virtual  string `json:"virtual"`  // local->remote
	Physical string `json:"physical"` // local->remote
	State    string `json:"state"`
	Role     string `json:"role"`
	Keyed    bool   `json:"keyed"`
	Helper   bool   `json:"helper,omitempty"` // its peer is away: the helpers run for it
	Conflict string `json:"conflict"`         // its §3.4.2 policy: abort or preempt
}

// Status lists the connections, sorted by virtual tuple.
func (e *Engine) Status() []ConnStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]ConnStatus, 0, len(e.conns))
	for t, c := range e.conns {
		out = append(out, ConnStatus{Proto: t.Proto.String(),
			Virtual:  t.Local.String() + "->" + t.Remote.String(),
			Physical: c.phys.Local.String() + "->" + c.phys.Remote.String(),
			State:    c.m.State.String(), Role: c.m.Role.String(), Keyed: c.keys != nil, Helper: c.helping,
			Conflict: string(e.policy(c))})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Virtual != out[j].Virtual {
			return out[i].Virtual < out[j].Virtual
		}
		return out[i].Proto < out[j].Proto
	})
	return out
}

// Counters are the daemon's counts (refusals by kind, restores), a copy.
func (e *Engine) Counters() map[string]uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]uint64, len(e.counters))
	for k, v := range e.counters {
		out[k] = v
	}
	return out
}

// logLimit lets one line of a kind through per second and says how many it
// held back: every refusal a remote host can provoke is logged this way.
type logLimit struct {
	last       time.Time
	suppressed int
}

// warn logs a refusal of kind, rate-limited per kind. Called with e.mu held.
func (e *Engine) warn(kind, msg string, args ...any) {
	e.counters[kind]++
	l := e.limit[kind]
	if l == nil {
		l = &logLimit{}
		e.limit[kind] = l
	}
	now := e.cfg.Now()
	if now.Sub(l.last) < time.Second {
		l.suppressed++
		return
	}
	if l.suppressed > 0 {
		args = append(args, "suppressed", l.suppressed)
	}
	l.last, l.suppressed = now, 0
	e.log.Warn(msg, args...)
}

// refusal names Open's error kinds for the counters.
func refusal(err error) string {
	switch {
	case errors.Is(err, vcmp.ErrForged):
		return "refused_forged"
	case errors.Is(err, vcmp.ErrReplayed):
		return "refused_replayed"
	case errors.Is(err, vcmp.ErrUnkeyed):
		return "refused_unkeyed"
	case errors.Is(err, vcmp.ErrNoKey):
		return "refused_nokey"
	}
	return "refused_other"
}

// touchKeys says what the key file keeps of c changed.
func (c *conn) touchKeys() {
	if c.keysDirty != nil {
		*c.keysDirty = true
	}
}

// newKeys starts a suspension's key exchange: a fresh pair, no agreed keys.
func (c *conn) newKeys() error {
	k, err := vcmp.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	if c.keys != nil {
		c.touchKeys() // the old keys leave the key file
	}
	c.priv, c.own, c.keys, c.peerPub, c.sendSeq, c.win = k, vcmp.PublicKey(k), nil, nil, 0, vcmp.Window{}
	return nil
}

// agree derives the update keys from the peer's public key.
func (c *conn) agree(peer [vcmp.KeyLen]byte) error {
	if c.keys != nil && c.peerPub != nil && *c.peerPub == peer {
		return nil // the same agreement, seen from the other side's message
	}
	if c.priv == nil {
		if err := c.newKeys(); err != nil {
			return err
		}
	}
	k, err := vcmp.DeriveKeys(c.priv, peer, c.m.Tuple)
	if err != nil {
		return err
	}
	c.keys, c.peerPub, c.sendSeq, c.win = &k, &peer, 0, vcmp.Window{}
	c.touchKeys()
	return nil
}

// seal seals an update or reply when the connection has keys.
func (c *conn) seal(m vcmp.Message) (vcmp.Message, error) {
	if c.keys == nil {
		return m, nil
	}
	c.sendSeq++
	c.touchKeys()
	return vcmp.Seal(m, c.keys.Send, c.sendSeq)
}

// open checks an update or reply against the connection's keys.
func (e *Engine) open(c *conn, m vcmp.Message) (vcmp.Message, error) {
	if c.keys == nil {
		return vcmp.Open(m, nil, nil, e.cfg.RequireKeys)
	}
	inner, err := vcmp.Open(m, &c.keys.Recv, &c.win, e.cfg.RequireKeys)
	if err == nil {
		c.touchKeys() // the window moved
	}
	return inner, err
}

// blank is the block of a refusal for a connection this end does not hold:
// the connection as named (anything missing zero), no physical end. It
// always encodes, so a refusal never breaks the stream.
func blank(conn vcmp.Tuple) vcmp.Record {
	zero := netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
	if !conn.Local.Addr().Is4() {
		conn.Local = zero
	}
	if !conn.Remote.Addr().Is4() {
		conn.Remote = zero
	}
	if conn.Proto != vcmp.TCP && conn.Proto != vcmp.UDP {
		conn.Proto = vcmp.TCP
	}
	return vcmp.Record{Conn: conn, Phys: zero}
}

// record is this end's block for c: the connection from here, where we are.
func (c *conn) record() vcmp.Record { return vcmp.Record{Conn: c.m.Tuple, Phys: c.phys.Local} }

// innerRecord is the connection block of an update, sealed or not.
func innerRecord(m vcmp.Message) (vcmp.Record, bool) {
	switch m := m.(type) {
	case *vcmp.Update:
		return m.Record, true
	case *vcmp.UpdateReply:
		return m.Record, true
	case *vcmp.Sealed:
		return innerRecord(m.Inner)
	}
	return vcmp.Record{}, false
}

// Handle answers one message a peer (at from) sent: the server side of
// VCMP. Every message gets an answer, so batches line up.
func (e *Engine) Handle(m vcmp.Message, from netip.Addr) vcmp.Message {
	return e.HandleBatch([]vcmp.Message{m}, from)[0]
}

// pendingUpdate is an accepted update whose translation is not written yet.
type pendingUpdate struct {
	i    int // its entry in the batch
	c    *conn
	phys vcmp.Tuple
}

// HandleBatch answers the messages of one batch a peer (at from) sent, in
// order. The updates it accepts are translated together: one batched map
// write and one route change per distinct address for a whole batch of
// updates from a mover, so restoring a connection costs the same however
// many move at once (issue 10 item 10).
func (e *Engine) HandleBatch(ms []vcmp.Message, from netip.Addr) []vcmp.Message {
	e.mu.Lock()
	defer e.mu.Unlock()
	// Before the answers leave: the sequence numbers sealed with and the
	// keys agreed are kept (a restart must not seal with one again).
	defer e.saveKeys()
	out := make([]vcmp.Message, len(ms))
	var pend []pendingUpdate
	inBatch := map[*conn]bool{}
	for i, m := range ms {
		switch m.(type) {
		case *vcmp.Update, *vcmp.Sealed:
			c, phys, ans := e.acceptUpdate(m, from, func(c *conn) {
				// A second update for a connection of this batch goes
				// after the first one's translation.
				if inBatch[c] {
					e.installPending(pend, out)
					pend, inBatch = nil, map[*conn]bool{}
				}
			})
			if ans != nil {
				out[i] = ans
				continue
			}
			pend = append(pend, pendingUpdate{i: i, c: c, phys: phys})
			inBatch[c] = true
		default:
			// Claims and keys see the updates before them applied.
			e.installPending(pend, out)
			pend, inBatch = nil, map[*conn]bool{}
			out[i] = e.handleLocked(m, from)
		}
	}
	e.installPending(pend, out)
	return out
}

// installPending writes the accepted updates' translations in one write
// and answers them: all applied, or (the write is all or nothing) all
// answered conflict. Called with e.mu held.
func (e *Engine) installPending(pend []pendingUpdate, out []vcmp.Message) {
	if len(pend) == 0 {
		return
	}
	maps := make([]Mapping, len(pend))
	for i, p := range pend {
		maps[i] = Mapping{Virtual: p.c.m.Tuple, Physical: p.phys}
	}
	if err := e.install(maps); err != nil {
		for _, p := range pend {
			e.warn("translate_errors", "vnat: install translation", "conn", p.c.m.Tuple, "err", err)
			out[p.i] = &vcmp.UpdateReply{Record: p.c.record(), Status: vcmp.UpdateConflict}
		}
		return
	}
	for _, p := range pend {
		p.c.phys = p.phys
		e.counters["updates_applied"]++
		e.dir.Forget(p.c.m.Tuple)
		reply, err := p.c.seal(&vcmp.UpdateReply{Record: p.c.record(), Status: vcmp.UpdateOK})
		if err != nil {
			continue // nil: Serve answers a refusal
		}
		out[p.i] = reply
	}
}

// handleLocked is Handle for everything but updates. Called with e.mu held.
func (e *Engine) handleLocked(m vcmp.Message, from netip.Addr) vcmp.Message {
	switch m := m.(type) {
	case *vcmp.LocQuery, *vcmp.LocStore:
		// Anyone may store a record, so their number is capped: a full
		// directory still answers what it knows but stores nothing more.
		if e.dir.Len() >= MaxRecords {
			switch q := m.(type) {
			case *vcmp.LocQuery:
				c := *q
				c.Store = false
				m = &c
			case *vcmp.LocStore:
				e.warn("directory_full", "vnat: location directory full, record refused", "from", from, "records", e.dir.Len())
				return &vcmp.LocAnswer{Record: q.Record, Status: vcmp.LocRefused}
			}
		}
		a, err := e.dir.Answer(m)
		if err != nil {
			return nil
		}
		return a
	case *vcmp.SuspPrimary:
		c, ok := e.conns[m.Conn.Reverse()]
		if !ok {
			return &vcmp.UpdateReply{Record: blank(m.Conn.Reverse()), Status: vcmp.UpdateUnknown}
		}
		if from != c.phys.Remote.Addr() {
			e.warn("refused_claim_source", "vnat: suspend claim from elsewhere than the peer", "conn", c.m.Tuple, "from", from, "peer", c.phys.Remote.Addr())
			return &vcmp.UpdateReply{Record: c.record(), Status: vcmp.UpdateRefused}
		}
		if c.m.State == vcmp.Suspended && c.m.Moving {
			// Crossing claims (figure 3-4(b)): we claimed too. Arbitrate
			// unless the peer's answer to our claim already did, and
			// answer with the role we hold: both ends decide alike, and
			// a peer still awaiting takes the other role from the answer.
			if c.m.Awaiting {
				e.step(c, vcmp.EvRecvSuspPrimary) //nolint:errcheck // Awaiting allows it
			}
			if c.m.Role == vcmp.RoleSecondary {
				return &vcmp.SuspSecondary{Record: c.record()}
			}
			return &vcmp.SuspPrimary{Record: c.record()}
		}
		wasState := c.m.State
		if _, err := e.step(c, vcmp.EvRecvSuspPrimary); err != nil {
			e.warn("unexpected", "vnat: suspend claim not expected", "conn", c.m.Tuple, "from", from, "err", err)
			return &vcmp.UpdateReply{Record: c.record(), Status: vcmp.UpdateConflict}
		}
		if wasState == vcmp.Active || wasState == vcmp.Migrated {
			// A new suspension: a fresh key pair (a retransmitted claim
			// is answered with the same one).
			if err := c.newKeys(); err != nil {
				return nil
			}
		}
		return &vcmp.SuspSecondary{Record: c.record()}
	case *vcmp.Key:
		c, ok := e.conns[m.Conn.Reverse()]
		if !ok {
			return &vcmp.UpdateReply{Record: blank(m.Conn.Reverse()), Status: vcmp.UpdateUnknown}
		}
		// Keys come only from where the peer is, and replace agreed keys
		// only in a new suspension: otherwise anyone who can reach port
		// 2031 and guess a 4-tuple could key the connection and then
		// move it.
		if from != c.phys.Remote.Addr() {
			e.warn("refused_key_source", "vnat: key from elsewhere than the peer", "conn", c.m.Tuple, "from", from, "peer", c.phys.Remote.Addr())
			return &vcmp.UpdateReply{Record: c.record(), Status: vcmp.UpdateRefused}
		}
		if c.keys != nil && (c.peerPub == nil || *c.peerPub != m.Public) && c.m.State != vcmp.Suspended {
			e.warn("refused_rekey", "vnat: new key outside a suspension", "conn", c.m.Tuple, "from", from)
			return &vcmp.UpdateReply{Record: c.record(), Status: vcmp.UpdateRefused}
		}
		if err := c.agree(m.Public); err != nil {
			e.warn("refused_key", "vnat: key refused", "conn", c.m.Tuple, "from", from, "err", err)
			return &vcmp.UpdateReply{Record: c.record(), Status: vcmp.UpdateRefused}
		}
		return &vcmp.Key{Record: c.record(), Public: c.own}
	}
	return nil
}

// acceptUpdate checks one update (its connection, keys, conflicts) and
// steps the connection; before stepping it calls before(c). It returns the
// connection and the physical tuple to translate it to, or the answer when
// the update is refused. Called with e.mu held.
func (e *Engine) acceptUpdate(m vcmp.Message, from netip.Addr, before func(*conn)) (*conn, vcmp.Tuple, vcmp.Message) {
	r, ok := innerRecord(m)
	if !ok {
		return nil, vcmp.Tuple{}, &vcmp.UpdateReply{Record: blank(vcmp.Tuple{}), Status: vcmp.UpdateRefused}
	}
	c, ok := e.conns[r.Conn.Reverse()]
	if !ok {
		e.warn("refused_unknown", "vnat: update for an unknown connection", "conn", r.Conn, "from", from)
		return nil, vcmp.Tuple{}, &vcmp.UpdateReply{Record: blank(r.Conn.Reverse()), Status: vcmp.UpdateUnknown}
	}
	before(c)
	inner, err := e.open(c, m)
	if err != nil {
		e.warn(refusal(err), "vnat: update refused", "conn", c.m.Tuple, "from", from, "err", err)
		return nil, vcmp.Tuple{}, &vcmp.UpdateReply{Record: c.record(), Status: vcmp.UpdateRefused}
	}
	if _, ok := inner.(*vcmp.Update); !ok {
		return nil, vcmp.Tuple{}, &vcmp.UpdateReply{Record: c.record(), Status: vcmp.UpdateRefused}
	}
	r, _ = innerRecord(inner)
	if r.Phys.Addr() == c.m.Tuple.Local.Addr() {
		// The peer is now at this end's own virtual address (the
		// network gave it our old one): packets to it would be
		// delivered here (paper §3.4.2; policy: abort).
		e.warn("conflict", "vnat: peer's new address is this end's virtual address", "conn", c.m.Tuple, "from", from, "phys", r.Phys)
		return nil, vcmp.Tuple{}, &vcmp.UpdateReply{Record: c.record(), Status: vcmp.UpdateConflict}
	}
	phys := vcmp.Tuple{Proto: c.phys.Proto, Local: c.phys.Local, Remote: r.Phys}
	o := e.holder(c, phys)
	if o != nil && e.policy(c) != ConflictPreempt {
		// Another live connection here already is that tuple (§3.4.2,
		// policy abort): it keeps it, this migration is aborted.
		e.warn("conflict", "vnat: the moved peer's tuple is another connection's here, migration aborted", "conn", c.m.Tuple, "from", from, "tuple", phys, "holder", o.m.Tuple)
		return nil, vcmp.Tuple{}, &vcmp.UpdateReply{Record: c.record(), Status: vcmp.UpdateConflict}
	}
	if _, err := e.step(c, vcmp.EvRecvUpdate); err != nil {
		e.warn("unexpected", "vnat: update not expected", "conn", c.m.Tuple, "from", from, "err", err)
		return nil, vcmp.Tuple{}, &vcmp.UpdateReply{Record: c.record(), Status: vcmp.UpdateConflict}
	}
	if o != nil {
		// Policy preempt: the migrating connection takes the tuple.
		if err := e.preempt(o, c); err != nil {
			e.warn("translate_errors", "vnat: preempt", "conn", c.m.Tuple, "err", err)
			return nil, vcmp.Tuple{}, &vcmp.UpdateReply{Record: c.record(), Status: vcmp.UpdateConflict}
		}
	}
	return c, phys, nil
}

// install writes translations; a connection back at its virtual tuple (a
// suspend and resume without a move) is untranslated instead, so the
// datapath keeps its nothing-migrated fast path.
func (e *Engine) install(maps []Mapping) error {
	var tr []Mapping
	var errs []error
	for _, m := range maps {
		if m.Physical == m.Virtual {
			errs = append(errs, e.tr.Forget(m.Virtual))
			continue
		}
		tr = append(tr, m)
	}
	if len(tr) > 0 {
		errs = append(errs, e.tr.Translate(tr))
	}
	return errors.Join(errs...)
}

// Serve answers one VCMP stream from a peer at from.
func (e *Engine) Serve(rw io.ReadWriter, from netip.Addr) error {
	return vcmp.ServeWholeBatches(rw, func(ms []vcmp.Message) []vcmp.Message {
		out := e.HandleBatch(ms, from)
		for i, a := range out {
			if a == nil {
				// Something we cannot answer: a refusal keeps the batch in step.
				r, _ := innerRecord(ms[i])
				out[i] = &vcmp.UpdateReply{Record: blank(r.Conn), Status: vcmp.UpdateRefused}
			}
		}
		return out
	})
}

// exchange sends msgs to the daemon at addr in batches and returns its answers.
func (e *Engine) exchange(ctx context.Context, addr netip.Addr, msgs []vcmp.Message) ([]vcmp.Message, error) {
	s, err := e.dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	return vcmp.Exchange(s, msgs)
}

// Suspend claims the primary role for the connections sel picks (all when
// nil) before this end moves (§3.3.1): SUSP_PRIMARY and KEY to each peer,
// one batch per peer. It returns how many connections it suspended.
func (e *Engine) Suspend(ctx context.Context, sel func(vcmp.Tuple) bool) (int, error) {
	if err := e.Sync(); err != nil {
		return 0, err
	}
	e.mu.Lock()
	byPeer := map[netip.Addr][]*conn{}
	msgs := map[netip.Addr][]vcmp.Message{}
	n := 0
	for t, c := range e.conns {
		if sel != nil && !sel(t) {
			continue
		}
		acts, err := e.step(c, vcmp.EvSuspend)
		if err != nil || len(acts) == 0 {
			continue // already suspended, or a secondary that now moves too
		}
		if err := c.newKeys(); err != nil {
			e.mu.Unlock()
			return n, err
		}
		n++
		p := c.phys.Remote.Addr()
		byPeer[p] = append(byPeer[p], c)
		msgs[p] = append(msgs[p], &vcmp.SuspPrimary{Record: c.record()}, &vcmp.Key{Record: c.record(), Public: c.own})
	}
	e.saveKeys() // the old keys are gone with the new suspension
	e.mu.Unlock()
	// One claim batch per peer, the peers at once: a peer that does not
	// answer must not hold up the claims to the others.
	var (
		wg   sync.WaitGroup
		emu  sync.Mutex
		errs []error
	)
	for p, cs := range byPeer {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.claim(ctx, p, cs, msgs[p]); err != nil {
				emu.Lock()
				errs = append(errs, err)
				emu.Unlock()
			}
		}()
	}
	wg.Wait()
	return n, errors.Join(errs...)
}

// SuspTries is how many times a claim (VNAT_SUSP_PRIMARY + VCMP_KEY) is
// sent to a peer that does not answer, with a doubling pause between
// tries, before its connections are primary by default (§3.3.1.2: no
// negotiation, both ends primary).
const SuspTries = 4

// claim sends one peer its claim batch until it answers or SuspTries are
// spent, and steps the connections with the answer. A retransmitted claim
// is the same batch (the same keys): a peer that took the first one but
// whose answer was lost answers again with the same role and key.
func (e *Engine) claim(ctx context.Context, p netip.Addr, cs []*conn, msgs []vcmp.Message) error {
	pause := e.cfg.SuspRetry
	var ans []vcmp.Message
	var err error
	for try := 1; ; try++ {
		tctx, cancel := context.WithTimeout(ctx, e.cfg.SuspTimeout)
		ans, err = e.exchange(tctx, p, msgs)
		cancel()
		if err == nil || try == SuspTries || ctx.Err() != nil {
			break
		}
		e.mu.Lock()
		e.counters["susp_retransmitted"]++
		e.mu.Unlock()
		e.log.Info("vnat: suspend claim unanswered, sending again", "peer", p, "try", try, "pause", pause, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
		pause *= 2
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		e.counters["susp_unanswered"]++
		for _, c := range cs {
			e.step(c, vcmp.EvTimeout) //nolint:errcheck // no answer: primary by default
		}
		return fmt.Errorf("vnatd: suspend with %s: no answer after %d tries, primary by default: %w", p, SuspTries, err)
	}
	for i, c := range cs {
		claim, key := ans[2*i], ans[2*i+1]
		switch claim.(type) {
		case *vcmp.SuspSecondary:
			e.step(c, vcmp.EvRecvSuspSecondary) //nolint:errcheck // only Awaiting changes
		case *vcmp.SuspPrimary:
			if c.m.Awaiting { // crossing: the peer's handler arbitrated too
				e.step(c, vcmp.EvRecvSuspPrimary) //nolint:errcheck
			}
		default:
			e.step(c, vcmp.EvTimeout) //nolint:errcheck // the peer does not know it: primary alone
		}
		if k, ok := key.(*vcmp.Key); ok {
			if err := c.agree(k.Public); err != nil {
				e.warn("refused_key", "vnat: peer key refused", "conn", c.m.Tuple, "err", err)
			}
		}
	}
	e.saveKeys()
	return nil
}

// MaxKeyTries is how many times AgreeKeys asks a peer's daemon that does
// not know a connection yet (it looks for new connections on its own clock).
const MaxKeyTries = 5

// AgreeKeys agrees update keys at first contact for the connections that
// have none and were never tried (one VCMP_KEY batch per peer), so that an
// unplanned move (no suspend) is authenticated too. A peer without a VNAT
// daemon is not asked again; one whose daemon does not know the connection
// yet is asked again on the next call, up to MaxKeyTries. It returns how many connections got keys.
func (e *Engine) AgreeKeys(ctx context.Context) (int, error) {
	e.mu.Lock()
	byPeer := map[netip.Addr][]*conn{}
	msgs := map[netip.Addr][]vcmp.Message{}
	for _, c := range e.conns {
		if c.keys != nil || c.keyTries >= MaxKeyTries || (c.m.State != vcmp.Active && c.m.State != vcmp.Migrated) {
			continue
		}
		c.keyTries++
		if err := c.newKeys(); err != nil {
			e.mu.Unlock()
			return 0, err
		}
		p := c.phys.Remote.Addr()
		byPeer[p] = append(byPeer[p], c)
		msgs[p] = append(msgs[p], &vcmp.Key{Record: c.record(), Public: c.own})
	}
	e.mu.Unlock()
	n := 0
	var errs []error
	for p, cs := range byPeer {
		ans, err := e.exchange(ctx, p, msgs[p])
		if err != nil {
			// No daemon there (or not reachable): not asked again.
			e.mu.Lock()
			for _, c := range cs {
				c.keyTries = MaxKeyTries
			}
			e.mu.Unlock()
			errs = append(errs, fmt.Errorf("vnatd: keys with %s: %w", p, err))
			continue
		}
		e.mu.Lock()
		for i, c := range cs {
			if r, ok := ans[i].(*vcmp.UpdateReply); ok && r.Status == vcmp.UpdateUnknown {
				continue // the peer has not seen the connection yet: asked again next time
			}
			if k, ok := ans[i].(*vcmp.Key); ok && c.keys == nil {
				if err := c.agree(k.Public); err == nil {
					n++
				}
			} else if ok {
				n++ // the peer's own first contact crossed ours and agreed already
			}
		}
		e.saveKeys()
		e.mu.Unlock()
	}
	return n, errors.Join(errs...)
}

// Restore is the paper's resume after this end's address changed from old
// to new: every connection travelling from old is located, updated (one
// batch per peer and place) and translated; the old address is kept local.
func (e *Engine) Restore(ctx context.Context, old, new netip.Addr) error {
	if e.cfg.OnRestore != nil {
		start := e.cfg.Now()
		defer func() { e.cfg.OnRestore(e.cfg.Now().Sub(start)) }()
	}
	if err := e.Sync(); err != nil {
		return err
	}
	e.mu.Lock()
	e.self[old], e.self[new] = true, true
	var cs []*conn
	for _, c := range e.conns {
		if c.phys.Local.Addr() == old {
			cs = append(cs, c)
		}
	}
	e.mu.Unlock()
	return e.restore(ctx, cs, new, true)
}

// Resume retries the walk for connections left suspended or locating
// (their peer has not found them yet), from this end's current place.
func (e *Engine) Resume(ctx context.Context) (int, error) {
	e.mu.Lock()
	var cs []*conn
	for _, c := range e.conns {
		if c.m.State == vcmp.Suspended || c.m.State == vcmp.Locating {
			if !c.oldLocal.IsValid() {
				// Suspended but never moved: the places are where both
				// ends are now.
				c.oldLocal, c.oldRemote = c.phys.Local.Addr(), c.phys.Remote.Addr()
			}
			cs = append(cs, c)
		}
	}
	e.mu.Unlock()
	return len(cs), e.restore(ctx, cs, netip.Addr{}, false)
}

// walk is one connection's locate walk in progress.
type walk struct {
	c      *conn
	loc    *vcmp.Locator
	failed bool // the walk ended with nobody reached
}

func (e *Engine) restore(ctx context.Context, cs []*conn, new netip.Addr, moved bool) error {
	if len(cs) == 0 {
		return nil
	}
	var errs []error
	// The sockets at the new address, for the ports taken there.
	var socks []Socket
	ports, _ := e.tr.(Ports)
	if moved && ports != nil {
		var err error
		if socks, err = ports.SocketsAt(new); err != nil {
			errs = append(errs, fmt.Errorf("vnatd: sockets at %s: %w", new, err))
		}
	}
	e.mu.Lock()
	kept := map[netip.Addr]bool{}
	var walks []*walk
	var used map[vcmp.Tuple]bool
	if moved {
		used = e.physUsed(cs)
	}
	for _, c := range cs {
		if moved {
			c.oldLocal, c.oldRemote = c.phys.Local.Addr(), c.phys.Remote.Addr()
			c.phys.Local = netip.AddrPortFrom(new, e.physPort(c, new, ports, socks, used))
			used[c.phys] = true
			kept[c.m.Tuple.Local.Addr()] = true
		}
		if _, err := e.step(c, vcmp.EvResume); err != nil {
			continue
		}
		if moved && new == c.m.Tuple.Remote.Addr() {
			// This end's new address is its peer's virtual address: the
			// connection's packets to the peer would be delivered here
			// (paper §3.4.2; policy: abort).
			e.warn("conflict", "vnat: new address is the peer's virtual address", "conn", c.m.Tuple, "new", new)
			e.step(c, vcmp.EvLocateFailed) //nolint:errcheck // Locating, not updating: allowed
			e.counters["aborted"]++
			continue
		}
		places := vcmp.LocateOrder(c.m.Role, c.oldLocal, c.oldRemote, e.cfg.LocationServers)
		var ps []vcmp.Place
		for _, p := range places {
			if !e.self[p.Addr] { // the whole endpoint moved: its old place is itself
				ps = append(ps, p)
			}
		}
		walks = append(walks, &walk{c: c, loc: vcmp.NewLocator(ps)})
	}
	e.counters["restores"]++
	e.mu.Unlock()
	for a := range kept {
		if err := e.tr.KeepLocal(a); err != nil {
			errs = append(errs, err)
		}
	}

	// The walk, in rounds: every connection still walking asks its next
	// place; the queries for one place go in one batch. A walk that
	// reached nobody starts again after a pause, for RetryFor: the new
	// address often comes before the route to the peer's place (DHCP,
	// the new subnet's gateway).
	found := map[netip.Addr][]*walk{}
	giveUp := e.cfg.Now().Add(e.cfg.RetryFor)
	pause := 100 * time.Millisecond
	for {
		e.walkRound(ctx, walks, found)
		var failed []*walk
		for _, w := range walks {
			if w.failed {
				failed = append(failed, w)
			}
		}
		if len(failed) == 0 || ctx.Err() != nil || e.cfg.Now().Add(pause).After(giveUp) {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
		pause = min(2*pause, 2*time.Second)
		e.mu.Lock()
		for _, w := range failed {
			w.failed = false
			w.loc = vcmp.NewLocator(w.loc.Places)
		}
		e.mu.Unlock()
	}
	e.mu.Lock()
	for _, w := range walks {
		if w.failed {
			e.step(w.c, vcmp.EvLocateFailed) //nolint:errcheck // Locating allows it
			e.counters["aborted"]++
		}
	}
	e.mu.Unlock()
	return e.update(ctx, walks, found, moved, errs)
}

// physUsed are the physical tuples of the connections that are not moving
// now (cs are): a moving one must not take one of them. Called with e.mu held.
func (e *Engine) physUsed(cs []*conn) map[vcmp.Tuple]bool {
	moving := make(map[*conn]bool, len(cs))
	for _, c := range cs {
		moving[c] = true
	}
	used := map[vcmp.Tuple]bool{}
	for _, c := range e.conns {
		if !moving[c] && c.m.State != vcmp.Aborted {
			used[c.phys] = true
		}
	}
	return used
}

// physPort is the port c travels from at its new address: its own (the
// virtual one) unless that is taken there, else one the kernel picks and
// holds for it (the peer learns it from VNAT_UPD's L_Phys_Port). Called
// with e.mu held.
func (e *Engine) physPort(c *conn, new netip.Addr, ports Ports, socks []Socket, used map[vcmp.Tuple]bool) uint16 {
	if ports == nil {
		return c.m.Tuple.Local.Port()
	}
	// A port held for an earlier move is at the old address: given back.
	if err := ports.Release(c.m.Tuple); err != nil {
		e.warn("port_errors", "vnat: release port", "conn", c.m.Tuple, "err", err)
	}
	want := vcmp.Tuple{Proto: c.m.Tuple.Proto, Local: netip.AddrPortFrom(new, c.m.Tuple.Local.Port()), Remote: c.phys.Remote}
	if !portTaken(want, socks, used) {
		return want.Local.Port()
	}
	p, err := ports.Reserve(c.m.Tuple, new)
	if err != nil {
		e.warn("port_errors", "vnat: port taken at the new address and no other free", "conn", c.m.Tuple, "err", err)
		return want.Local.Port()
	}
	e.counters["ports_remapped"]++
	e.log.Info("vnat: port taken at the new address, travelling from another", "conn", c.m.Tuple, "new", netip.AddrPortFrom(new, p))
	return p
}

// abort ends a migration the peer refused (unknown connection, not
// authenticated, conflict): the paper's "the migration of the connection
// will be aborted". The machine aborts only a walk that is not updating,
// so the update is dropped first (EvResume) and the walk failed.
// Called with e.mu held.
func (e *Engine) abort(c *conn) {
	if _, err := e.step(c, vcmp.EvResume); err == nil {
		e.step(c, vcmp.EvLocateFailed) //nolint:errcheck // Locating, not updating: allowed
	}
	e.counters["aborted"]++
}

// walkRound walks every connection's locate order to its end once.
func (e *Engine) walkRound(ctx context.Context, walks []*walk, found map[netip.Addr][]*walk) {
	for {
		byPlace := map[netip.Addr][]*walk{}
		e.mu.Lock()
		for _, w := range walks {
			if p, ok := w.loc.Next(); ok {
				byPlace[p.Addr] = append(byPlace[p.Addr], w)
			} else if len(w.loc.Places) == 0 {
				w.failed = true // nowhere to ask
			}
		}
		e.mu.Unlock()
		if len(byPlace) == 0 {
			break
		}
		for place, ws := range byPlace {
			msgs := make([]vcmp.Message, len(ws))
			e.mu.Lock()
			for i, w := range ws {
				msgs[i] = vcmp.Query(w.c.record())
			}
			e.mu.Unlock()
			ans, err := e.exchange(ctx, place, msgs)
			if err != nil {
				e.log.Info("vnat: place unreachable", "place", place, "err", err)
			}
			// The peer's own address refused VCMP outright: the peer is
			// there and answers TCP, but runs no VNAT daemon. If it never
			// keyed the connection either, it has none: no location server
			// can bring a VNAT_UPD from it, so waiting there would hang the
			// connection for ever. The walk fails (retried for RetryFor, in
			// case a daemon is starting) and the migration is aborted.
			refused := errors.Is(err, syscall.ECONNREFUSED)
			e.mu.Lock()
			for i, w := range ws {
				if refused && w.c.keys == nil && place == w.c.oldRemote {
					e.warn("no_peer_daemon", "vnat: the peer runs no VNAT daemon (VCMP refused at its address)", "conn", w.c.m.Tuple, "peer", place)
					w.loc.GiveUp()
					w.failed = true
					continue
				}
				var a *vcmp.LocAnswer
				if err == nil {
					a, _ = ans[i].(*vcmp.LocAnswer)
				}
				switch w.loc.Result(a) {
				case vcmp.Found:
					e.step(w.c, vcmp.EvFound) //nolint:errcheck // Locating: send the update
					found[w.loc.Peer.Addr()] = append(found[w.loc.Peer.Addr()], w)
				case vcmp.StoredOnly:
					e.step(w.c, vcmp.EvStored) //nolint:errcheck // wait for the peer
				case vcmp.Failed:
					w.failed = true
				}
			}
			e.mu.Unlock()
		}
	}
}

// update sends the updates of the walks that found their peer, one batch
// per peer, and installs every translation in one write. Before any update
// is sent, this end accepts packets at its new address (the ingress half
// of each translation, towards where the walk found the peer): the peer
// translates as soon as it accepts an update and may send at once (a
// keepalive, data), and a segment reaching the new address before the
// translation found no socket with that tuple and was answered with a
// RESET (the restore race the Table 1 benchmark found). The egress half
// waits for the peer's answer, or this end's segments would be reset at
// the peer the same way. A connection the peer refuses is no longer
// accepted there.
func (e *Engine) update(ctx context.Context, walks []*walk, found map[netip.Addr][]*walk, moved bool, errs []error) error {
	var early []Mapping
	e.mu.Lock()
	for _, ws := range found {
		for _, w := range ws {
			if p := (vcmp.Tuple{Proto: w.c.phys.Proto, Local: w.c.phys.Local, Remote: w.loc.Peer}); p != w.c.m.Tuple {
				early = append(early, Mapping{Virtual: w.c.m.Tuple, Physical: p})
			}
		}
	}
	e.mu.Unlock()
	accepted := false
	if len(early) > 0 {
		if err := e.tr.Accept(early); err != nil {
			// All or nothing: nothing was accepted, so the translations
			// follow the replies alone (a window for a RESET, but no
			// connection half-translated).
			e.mu.Lock()
			e.warn("translate_errors", "vnat: accept at the new address before the updates", "conns", len(early), "err", err)
			e.mu.Unlock()
		} else {
			accepted = true
		}
	}
	var withdraw []vcmp.Tuple

	var maps []Mapping
	var applied []*conn
	var phys []vcmp.Tuple
	for peer, ws := range found {
		msgs := make([]vcmp.Message, 0, len(ws))
		e.mu.Lock()
		for _, w := range ws {
			m, err := w.c.seal(&vcmp.Update{Record: w.c.record()})
			if err != nil {
				errs = append(errs, err)
				m = &vcmp.Update{Record: w.c.record()}
			}
			msgs = append(msgs, m)
		}
		e.saveKeys() // the sequence numbers used, before the updates leave
		e.mu.Unlock()
		ans, err := e.exchange(ctx, peer, msgs)
		if err != nil {
			errs = append(errs, fmt.Errorf("vnatd: update %d connections at %s: %w", len(ws), peer, err))
			continue // accepted still: whether the peer applied them is unknown; `resume` retries
		}
		e.mu.Lock()
		for i, w := range ws {
			refused := func() {
				e.abort(w.c)
				if accepted {
					withdraw = append(withdraw, w.c.m.Tuple)
					e.counters["translations_withdrawn"]++
				}
			}
			inner, err := e.open(w.c, ans[i])
			if err != nil {
				if r, ok := ans[i].(*vcmp.UpdateReply); ok && r.Status != vcmp.UpdateOK {
					e.warn("update_refused_by_peer", "vnat: peer refused update", "conn", w.c.m.Tuple, "status", r.Status)
					refused()
				} else {
					// A reply we cannot trust: left locating, `resume` retries.
					e.warn(refusal(err), "vnat: update reply refused", "conn", w.c.m.Tuple, "from", peer, "err", err)
				}
				continue
			}
			r, ok := inner.(*vcmp.UpdateReply)
			if !ok || r.Status != vcmp.UpdateOK {
				e.warn("update_refused_by_peer", "vnat: peer refused update", "conn", w.c.m.Tuple)
				refused()
				continue
			}
			if _, err := e.step(w.c, vcmp.EvRecvUpdateReply); err != nil {
				continue
			}
			p := vcmp.Tuple{Proto: w.c.phys.Proto, Local: w.c.phys.Local, Remote: r.Phys}
			maps = append(maps, Mapping{Virtual: w.c.m.Tuple, Physical: p})
			applied = append(applied, w.c)
			phys = append(phys, p)
		}
		e.saveKeys() // the windows moved
		e.mu.Unlock()
	}
	// Connections still waiting translate their own end now: packets from
	// them leave from the new address, and the peer's update completes them.
	e.mu.Lock()
	for _, w := range walks {
		if w.c.m.State == vcmp.Suspended && moved {
			maps = append(maps, Mapping{Virtual: w.c.m.Tuple, Physical: w.c.phys})
		}
	}
	e.mu.Unlock()
	if len(withdraw) > 0 {
		if err := e.tr.Unaccept(withdraw); err != nil {
			errs = append(errs, fmt.Errorf("vnatd: withdraw %d refused connections: %w", len(withdraw), err))
		}
	}
	if len(maps) > 0 {
		if err := e.install(maps); err != nil {
			errs = append(errs, fmt.Errorf("vnatd: install %d translations: %w", len(maps), err))
			return errors.Join(errs...)
		}
		e.mu.Lock()
		for i, c := range applied {
			c.phys = phys[i]
			e.dir.Forget(c.m.Tuple)
		}
		e.counters["migrated"] += uint64(len(applied))
		e.mu.Unlock()
	}
	return errors.Join(errs...)
}
