// Package vnatd is the VNAT endpoint daemon (`onehop vnat run`, issue 10):
// it keeps every connection's migration state (internal/vcmp's role
// machine), answers VCMP on TCP 2031, and when the endpoint's address
// changes restores its connections the paper's way (§3.3.2): locate the
// peer, exchange keyed updates in one batch per peer, install the
// translations (internal/vnat).
//
// The engine is pure: no kernel, no sockets. engine.go holds the Engine
// and its seams, server.go answers VCMP, suspend.go claims and agrees keys
// before a move, restore.go walks after one, crypto.go keeps a connection's
// keys and log.go the rate-limited log. The kernel and the network come in
// through Translator and Dialer, so the restore flow is tested with fakes
// (engine_test.go); kernel.go and run.go are the thin adapters.
package vnatd

import (
	"context"
	"crypto/ecdh"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/backoff"
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
	// AllowUnkeyed takes unauthenticated updates for connections without
	// agreed keys (--allow-unkeyed), from the peer's own address only and
	// rate-limited per source; the zero value refuses them (keyed
	// migration is the default).
	AllowUnkeyed bool
	// Logger; nil is slog.Default().
	Logger *slog.Logger
	// Now; nil is time.Now (the log limiter's and retries' clock).
	Now func() time.Time
	// WalkRetry is how a locate walk that reached nobody is retried
	// before the migration is aborted; a zero field is walkRetry's (100 ms
	// doubling to 2 s, for 15 s).
	WalkRetry backoff.Backoff
	// Helpers run for each connection whose peer is away (helpers.go).
	Helpers []Helper
	// MaxAway bounds how long the helpers run for one connection: a peer
	// away longer (suspended and never back) is no longer helped, and the
	// application's own timeouts decide (ExpireAway). 0 is unbounded.
	MaxAway time.Duration
	// ClaimRetry is how a suspend claim is sent again to a peer that did
	// not answer; a zero field is claimRetry's (250 ms doubling, SuspTries
	// in all).
	ClaimRetry backoff.Backoff
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
	keyRetry            *backoff.Retry // AgreeKeys' tries (keyRetry); nil: never asked
	sendSeq             uint64
	win                 vcmp.Window
	helping             bool      // the helpers run for it (its peer is away)
	awaySince           time.Time // when the helpers started for it
	// awayExpired: its peer was away longer than MaxAway and the
	// helpers were stopped; it waits for the peer unhelped.
	awayExpired bool
	conflict    Conflict // its §3.4.2 policy; default: the daemon's
	// keysDirty is the engine's flag: set when what the key file keeps
	// of this connection changed.
	keysDirty *bool
}

// record is this end's block for c: the connection from here, where we are.
func (c *conn) record() vcmp.Record { return vcmp.Record{Conn: c.m.Tuple, Phys: c.phys.Local} }

// Engine is the daemon's state and decisions.
type Engine struct {
	cfg  Config
	tr   Translator
	dial Dialer
	log  *slog.Logger

	mu    sync.Mutex
	conns map[vcmp.Tuple]*conn
	// byPhys are the connections by the physical tuple they travel as
	// (holder's index; setPhys keeps it).
	byPhys   map[vcmp.Tuple][]*conn
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
	// misses and unkeyed limit each source's updates (throttle.go).
	misses, unkeyed *perSource
}

// OnStop makes a control "stop" request call f (the daemon's clean stop).
func (e *Engine) OnStop(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stop = f
}

// New is an engine over a datapath and a network.
func New(cfg Config, tr Translator, dial Dialer) *Engine {
	e := &Engine{cfg: cfg, tr: tr, dial: dial, log: cfg.Logger, conns: map[vcmp.Tuple]*conn{}, byPhys: map[vcmp.Tuple][]*conn{},
		counters: map[string]uint64{}, limit: map[string]*logLimit{}, self: map[netip.Addr]bool{}, keys: cfg.Keys}
	if e.log == nil {
		e.log = slog.Default()
	}
	if e.cfg.Now == nil {
		e.cfg.Now = time.Now
	}
	e.misses = newPerSource(MissPerSecond, MissBurst, e.cfg.Now)
	e.unkeyed = newPerSource(UnkeyedPerSecond, UnkeyedBurst, e.cfg.Now)
	e.cfg.WalkRetry = e.cfg.WalkRetry.Or(walkRetry)
	e.cfg.ClaimRetry = e.cfg.ClaimRetry.Or(claimRetry)
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
			c := &conn{m: vcmp.NewConn(m.Virtual), keysDirty: &e.keysDirty}
			e.setPhys(c, m.Physical)
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
		e.unindex(c)
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
	// AwayExpired: its peer was away longer than --max-away; the helpers
	// were stopped and the application's own timeouts decide.
	AwayExpired bool   `json:"away_expired,omitempty"`
	Conflict    string `json:"conflict"` // its §3.4.2 policy: abort or preempt
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
			State:    c.m.State.String(), Role: c.m.Role.String(), Keyed: c.keys != nil, Helper: c.helping, AwayExpired: c.awayExpired,
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

// exchange sends msgs to the daemon at addr in batches and returns its answers.
func (e *Engine) exchange(ctx context.Context, addr netip.Addr, msgs []vcmp.Message) ([]vcmp.Message, error) {
	s, err := e.dial(ctx, addr)
	if err != nil {
		return nil, &unreachedError{err: err}
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	return vcmp.Exchange(s, msgs)
}
