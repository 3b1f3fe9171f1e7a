package vnatd

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/onehop/onehop/internal/backoff"
	"github.com/onehop/onehop/internal/vcmp"
)

// After a move: the restore walk (§3.3.2). Every connection that travelled
// from the old address locates its peer along its locate order, in rounds
// retried while nobody is reached; then each peer found gets the keyed
// updates of its connections in one batch, and the translations are
// installed in one write.

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
	// foundAt is the place that answered Found (the peer's own daemon
	// answering for itself when it is loc.Peer's address, else a record).
	foundAt netip.Addr
	// stale are the peer locations this walk was given that the update
	// could not reach (a record left from before the peer moved again):
	// a walk with stale locations stores first and queries after, and
	// takes a stale answer for "not found".
	stale map[netip.AddrPort]bool
	// stored: a store-first walk's location was stored somewhere.
	stored bool
	// storedOnly: the walk ended stored only (the peer found nowhere);
	// unreached: a place of it could not be reached (no answer at all,
	// which is not "the peer is not here"); storedTries: the walks that
	// ended stored only so far (locate walks it again, StoredTries in all).
	storedOnly, unreached bool
	storedTries           int
}

// MaxStaleRounds bounds how many times one restore walks again for a
// connection whose found peer location was stale: each round adds the
// failed location to the stale ones, so only a place answering a new dead
// location every time could use them all.
const MaxStaleRounds = 3

// unreachedError is a dial that failed: nothing of the exchange was
// delivered (unlike a stream cut after the messages left, which the peer
// may have acted on).
type unreachedError struct{ err error }

func (u *unreachedError) Error() string { return u.err.Error() }
func (u *unreachedError) Unwrap() error { return u.err }

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
			p := c.phys
			p.Local = netip.AddrPortFrom(new, e.physPort(c, new, ports, socks, used))
			e.setPhys(c, p)
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

	found := map[netip.Addr][]*walk{}
	e.locate(ctx, walks, found)
	stale, err := e.update(ctx, walks, found, moved)
	errs = append(errs, err)
	// A peer location that proved stale (the update could not reach it:
	// the record predates the peer's latest move, paper §3.3.2.1 "both
	// ends moved") is the same as not finding the peer: the walk goes
	// again without it, storing this end's location at every place and
	// querying after, and waits for the peer's update. Bounded: the
	// stale locations only grow.
	for round := 1; len(stale) > 0; round++ {
		if round > MaxStaleRounds {
			errs = append(errs, e.waitStale(stale, moved))
			break
		}
		e.mu.Lock()
		for _, w := range stale {
			if len(w.loc.Stored) > 0 {
				w.stored = true // the walk that found the stale location stored on its way
			}
			var ps []vcmp.Place
			for _, p := range w.loc.Places {
				if !staleAddr(w.stale, p.Addr) { // nothing answers VCMP for the peer there
					ps = append(ps, p)
				}
			}
			w.loc, w.failed = vcmp.NewLocator(ps), false
		}
		e.mu.Unlock()
		found = map[netip.Addr][]*walk{}
		e.locate(ctx, stale, found)
		stale, err = e.update(ctx, stale, found, moved)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// staleAddr says whether a is the address of one of the stale locations.
func staleAddr(stale map[netip.AddrPort]bool, a netip.Addr) bool {
	for s := range stale {
		if s.Addr() == a {
			return true
		}
	}
	return false
}

// waitStale ends the walks still stale after MaxStaleRounds: one whose
// location was stored somewhere waits there for its peer, the others are
// aborted (nobody can find them).
func (e *Engine) waitStale(ws []*walk, moved bool) error {
	var maps []Mapping
	e.mu.Lock()
	for _, w := range ws {
		if w.stored {
			e.step(w.c, vcmp.EvStored) //nolint:errcheck // Locating, not updating
			if moved {
				maps = append(maps, Mapping{Virtual: w.c.m.Tuple, Physical: w.c.phys})
			}
			continue
		}
		e.step(w.c, vcmp.EvLocateFailed) //nolint:errcheck // Locating, not updating
		e.counters["aborted"]++
	}
	e.mu.Unlock()
	if len(maps) == 0 {
		return nil
	}
	if err := e.install(maps); err != nil {
		return fmt.Errorf("vnatd: install %d translations: %w", len(maps), err)
	}
	return nil
}

// locate walks every connection's places until it found its peer, stored
// its location, or reached nobody for as long as WalkRetry allows (then it
// is aborted).
func (e *Engine) locate(ctx context.Context, walks []*walk, found map[netip.Addr][]*walk) {
	// The walk, in rounds: every connection still walking asks its next
	// place; the queries for one place go in one batch. A walk that
	// reached nobody starts again after a pause, on WalkRetry: the new
	// address often comes before the route to the peer's place (DHCP,
	// the new subnet's gateway).
	//
	// A walk that stored its location but could not reach some place is
	// walked again too, StoredTries walks in all, before it settles to
	// wait: "stored only" means the peer moved as well, but an unreached
	// place may be a peer that never moved, behind a route or mapping not
	// ready yet. Settled at once, the connection waited for an update
	// that peer never sends, its own end translated, and the peer reset
	// the connection at its next segment (the e2e flake of the reverted
	// stale-location work). Between its walks it waits suspended, so a
	// peer that did move and finds it at a server settles it meanwhile.
	retry := e.cfg.WalkRetry.Start(e.cfg.Now())
	for {
		e.walkRound(ctx, walks, found)
		var failed, again []*walk
		e.mu.Lock()
		for _, w := range walks {
			switch {
			case w.failed && len(w.loc.Places) > 0: // with nowhere to ask, asking again changes nothing
				failed = append(failed, w)
			case w.storedOnly && w.unreached && w.c.m.State == vcmp.Suspended && w.storedTries < StoredTries:
				again = append(again, w)
			}
		}
		e.mu.Unlock()
		if len(failed)+len(again) == 0 || ctx.Err() != nil {
			break
		}
		pause, ok := retry.Next(e.cfg.Now())
		if !ok {
			break
		}
		backoff.Sleep(ctx, pause) // an ended ctx ends the walk after the next round
		e.mu.Lock()
		for _, w := range failed {
			w.failed = false
			w.loc = vcmp.NewLocator(w.loc.Places)
		}
		for _, w := range again {
			if w.c.m.State != vcmp.Suspended {
				continue // the peer's update came meanwhile
			}
			if _, err := e.step(w.c, vcmp.EvResume); err != nil {
				continue
			}
			w.storedOnly, w.unreached = false, false
			w.loc = vcmp.NewLocator(w.loc.Places)
		}
		e.mu.Unlock()
	}
	e.mu.Lock()
	for _, w := range walks {
		switch {
		case w.failed && w.stored:
			// A walk again after a stale location that reached nobody
			// this time, but stored its location before: it waits there.
			e.step(w.c, vcmp.EvStored) //nolint:errcheck // Locating, not updating
		case w.failed:
			e.step(w.c, vcmp.EvLocateFailed) //nolint:errcheck // Locating allows it
			e.counters["aborted"]++
		}
	}
	e.mu.Unlock()
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
			// first[i] is walk i's first message: its query, or for a
			// walk with stale locations its store, then its query.
			msgs := make([]vcmp.Message, 0, len(ws))
			first := make([]int, len(ws))
			e.mu.Lock()
			for i, w := range ws {
				first[i] = len(msgs)
				if w.stale != nil {
					// Store first, query after: a peer that queries this
					// place between the two finds this end, and one that
					// stored here before is found by the query.
					msgs = append(msgs, &vcmp.LocStore{Record: w.c.record()})
				}
				msgs = append(msgs, vcmp.Query(w.c.record()))
			}
			e.mu.Unlock()
			ans, err := e.exchange(ctx, place, msgs)
			if err != nil {
				e.log.Info("vnat: place unreachable", "place", place, "err", err)
			}
			// The peer's own address refused VCMP outright: the peer is
			// there and answers TCP, but runs no VNAT daemon. If it never
			// keyed the connection either, and never moved (a peer that
			// moved did so with a daemon: its old address refusing is
			// another host's now), it has none: no location server can
			// bring a VNAT_UPD from it, so waiting there would hang the
			// connection for ever. The walk fails (retried on WalkRetry, in
			// case a daemon is starting) and the migration is aborted.
			refused := errors.Is(err, syscall.ECONNREFUSED)
			e.mu.Lock()
			for i, w := range ws {
				if refused && w.c.keys == nil && place == w.c.oldRemote && place == w.c.m.Tuple.Remote.Addr() {
					e.warn("no_peer_daemon", "vnat: the peer runs no VNAT daemon (VCMP refused at its address)", "conn", w.c.m.Tuple, "peer", place)
					w.loc.GiveUp()
					w.failed = true
					continue
				}
				var a *vcmp.LocAnswer
				if err != nil {
					w.unreached = true
				}
				if err == nil {
					q := first[i]
					if w.stale != nil {
						q++
					}
					a, _ = ans[q].(*vcmp.LocAnswer)
					if w.stale != nil {
						st, _ := ans[first[i]].(*vcmp.LocAnswer)
						stored := st != nil && st.Status == vcmp.LocStored
						if stored {
							w.stored = true
						}
						if a != nil && a.Status == vcmp.LocFound && w.stale[a.Peer] {
							// The stale record again: not found; ours is
							// stored (or not) by the store before.
							a = &vcmp.LocAnswer{Record: a.Record, Status: vcmp.LocNotFound}
							if stored {
								a.Status = vcmp.LocStored
							}
						}
					}
				}
				switch w.loc.Result(a) {
				case vcmp.Found:
					w.foundAt = place
					e.step(w.c, vcmp.EvFound) //nolint:errcheck // Locating: send the update
					found[w.loc.Peer.Addr()] = append(found[w.loc.Peer.Addr()], w)
				case vcmp.StoredOnly:
					w.storedOnly = true
					w.storedTries++
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
// accepted there. It returns the walks whose peer location proved stale
// (staleLocation): they walk again.
func (e *Engine) update(ctx context.Context, walks []*walk, found map[netip.Addr][]*walk, moved bool) ([]*walk, error) {
	var errs []error
	var stale []*walk
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
			// Nothing was delivered, to a location a record gave (not the
			// peer's own daemon answering for itself a moment ago, which
			// is there: a lost SYN): the location is stale.
			var unreached *unreachedError
			n := 0
			e.mu.Lock()
			for _, w := range ws {
				if errors.As(err, &unreached) && w.foundAt != peer {
					stale = append(stale, w)
					e.staleLocation(w, err)
					if accepted {
						withdraw = append(withdraw, w.c.m.Tuple)
					}
					continue
				}
				n++
			}
			e.mu.Unlock()
			if n > 0 {
				// Accepted still: whether the peer applied them is unknown; `resume` retries.
				errs = append(errs, fmt.Errorf("vnatd: update %d connections at %s: %w", n, peer, err))
			}
			continue
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
			if r, ok := ans[i].(*vcmp.UpdateReply); ok && r.Status == vcmp.UpdateUnknown && w.foundAt != peer {
				// A record sent the update to a daemon that does not hold
				// the connection (another host has the peer's old
				// address now): stale too. The peer's own daemon
				// answering for itself and then not knowing it is a
				// refusal, below.
				stale = append(stale, w)
				e.staleLocation(w, fmt.Errorf("%s does not know the connection", peer))
				if accepted {
					withdraw = append(withdraw, w.c.m.Tuple)
				}
				continue
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
			return stale, errors.Join(errs...)
		}
		e.mu.Lock()
		for i, c := range applied {
			e.setPhys(c, phys[i])
			e.dir.Forget(c.m.Tuple)
		}
		e.counters["migrated"] += uint64(len(applied))
		e.mu.Unlock()
	}
	return stale, errors.Join(errs...)
}

// staleLocation drops the update of a walk whose peer was not where the
// walk found it (a location record from before the peer's latest move,
// or an old place's): the location joins the walk's stale ones and the
// connection is locating again. Called with e.mu held.
func (e *Engine) staleLocation(w *walk, err error) {
	if w.stale == nil {
		w.stale = map[netip.AddrPort]bool{}
	}
	w.stale[w.loc.Peer] = true
	e.step(w.c, vcmp.EvResume) //nolint:errcheck // Locating: the update is dropped, the walk starts over
	e.warn("stale_locations", "vnat: the peer is not where the walk found it (a stale record): storing this end's location and waiting for the peer",
		"conn", w.c.m.Tuple, "peer", w.loc.Peer, "found_at", w.foundAt, "err", err)
}
