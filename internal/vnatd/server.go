package vnatd

import (
	"errors"
	"io"
	"net/netip"

	"github.com/onehop/onehop/internal/vcmp"
)

// The server side of VCMP (TCP 2031): location queries and stores, suspend
// claims, keys and updates from peers, answered in batches.

// MaxRecords caps the location records one daemon keeps for others.
const MaxRecords = 65536

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
		e.setPhys(p.c, p.phys)
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
		c, refused := e.fromPeer(m.Conn, from, "refused_claim_source", "vnat: suspend claim from elsewhere than the peer")
		if refused != nil {
			return refused
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
		// Keys come only from where the peer is, and replace agreed keys
		// only in a new suspension: otherwise anyone who can reach port
		// 2031 and guess a 4-tuple could key the connection and then
		// move it.
		c, refused := e.fromPeer(m.Conn, from, "refused_key_source", "vnat: key from elsewhere than the peer")
		if refused != nil {
			return refused
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

// fromPeer is the connection a claim or key names (its tuple as the sender
// sees it), or the answer refusing the message: the connection is unknown
// here, or the message (kind and msg log it) came from elsewhere than where
// the peer is. Called with e.mu held.
func (e *Engine) fromPeer(named vcmp.Tuple, from netip.Addr, kind, msg string) (*conn, vcmp.Message) {
	c, ok := e.conns[named.Reverse()]
	if !ok {
		return nil, &vcmp.UpdateReply{Record: blank(named.Reverse()), Status: vcmp.UpdateUnknown}
	}
	if from != c.phys.Remote.Addr() {
		e.warn(kind, msg, "conn", c.m.Tuple, "from", from, "peer", c.phys.Remote.Addr())
		return nil, &vcmp.UpdateReply{Record: c.record(), Status: vcmp.UpdateRefused}
	}
	return c, nil
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
	if e.misses.empty(from) {
		// A sprayer: refused unread, and told nothing of what exists here.
		e.warn("refused_throttled", "vnat: updates from a source that sends them for connections it does not own, throttled", "from", from)
		return nil, vcmp.Tuple{}, &vcmp.UpdateReply{Record: blank(r.Conn.Reverse()), Status: vcmp.UpdateRefused}
	}
	c, ok := e.conns[r.Conn.Reverse()]
	if !ok {
		e.miss(from)
		e.warn("refused_unknown", "vnat: update for an unknown connection", "conn", r.Conn, "from", from)
		return nil, vcmp.Tuple{}, &vcmp.UpdateReply{Record: blank(r.Conn.Reverse()), Status: vcmp.UpdateUnknown}
	}
	before(c)
	_, plain := m.(*vcmp.Update)
	if plain && c.keys == nil && e.cfg.AllowUnkeyed && from != c.phys.Remote.Addr() {
		// Without keys nothing proves the sender is the peer: it must at
		// least be where the peer was.
		e.miss(from)
		e.warn("refused_unkeyed_source", "vnat: unkeyed update from elsewhere than the peer", "conn", c.m.Tuple, "from", from, "peer", c.phys.Remote.Addr())
		return nil, vcmp.Tuple{}, &vcmp.UpdateReply{Record: c.record(), Status: vcmp.UpdateRefused}
	}
	inner, err := e.open(c, m)
	if err != nil {
		if !errors.Is(err, vcmp.ErrReplayed) { // a retry of a real update may be late
			e.miss(from)
		}
		e.warn(refusal(err), "vnat: update refused", "conn", c.m.Tuple, "from", from, "err", err)
		return nil, vcmp.Tuple{}, &vcmp.UpdateReply{Record: c.record(), Status: vcmp.UpdateRefused}
	}
	if _, ok := inner.(*vcmp.Update); !ok {
		return nil, vcmp.Tuple{}, &vcmp.UpdateReply{Record: c.record(), Status: vcmp.UpdateRefused}
	}
	if plain && !e.unkeyed.take(from) {
		e.warn("refused_unkeyed_rate", "vnat: unkeyed updates from one source over their rate", "conn", c.m.Tuple, "from", from,
			"per_second", UnkeyedPerSecond)
		return nil, vcmp.Tuple{}, &vcmp.UpdateReply{Record: c.record(), Status: vcmp.UpdateRefused}
	}
	r, _ = innerRecord(inner)
	at := moverAt(r.Phys, from)
	if at.Addr() == c.m.Tuple.Local.Addr() {
		// The peer is now at this end's own virtual address (the
		// network gave it our old one): packets to it would be
		// delivered here (paper §3.4.2; policy: abort).
		e.warn("conflict", "vnat: peer's new address is this end's virtual address", "conn", c.m.Tuple, "from", from, "phys", at)
		return nil, vcmp.Tuple{}, &vcmp.UpdateReply{Record: c.record(), Status: vcmp.UpdateConflict}
	}
	if at != r.Phys {
		// Counted, not refused: a mover behind a NAT (the paper's
		// laptop) is what this is for.
		e.counters["updates_from_nat"]++
		e.log.Info("vnat: update from another address than the mover names: behind a NAT, translated to where it came from",
			"conn", c.m.Tuple, "named", r.Phys, "from", at)
	}
	phys := vcmp.Tuple{Proto: c.phys.Proto, Local: c.phys.Local, Remote: at}
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

// moverAt is where an accepted update moves the connection's peer to: the
// address the update came from, with the port the mover names. The mover
// names its own physical end, but behind a NAT (the paper's laptop) that
// is a private address nobody here can reach; the stream's source is the
// NAT's, which the connection's own packets will come from too. Whoever
// sent it is the peer (the key proves it, or, unkeyed, it came from where
// the peer was). The port is the mover's: its VCMP stream and its
// connection leave from different ports, and a NAT keeps a flow's port
// where it is free (a NAT that picks ports at random is not followed).
func moverAt(named netip.AddrPort, from netip.Addr) netip.AddrPort {
	if !from.Is4() {
		return named
	}
	return netip.AddrPortFrom(from, named.Port())
}

// miss counts an update from from for a connection it does not own; the
// source is throttled once its budget is spent. Called with e.mu held.
func (e *Engine) miss(from netip.Addr) {
	if e.misses.take(from) && e.misses.empty(from) { // this one spent its budget
		e.warn("sources_throttled", "vnat: a source sends updates for connections it does not own: throttled", "from", from,
			"burst", MissBurst, "per_second", MissPerSecond)
	}
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
