package vcmp

import (
	"fmt"
	"net/netip"
	"time"
)

// PlaceKind says why a place is on a locate walk.
type PlaceKind uint8

// Place kinds, in the paper's order (§3.3.2.1).
const (
	SecondaryOld   PlaceKind = iota + 1 // the secondary's old location (P(1), S(1))
	PrimaryOld                          // the primary's old location (P(2), S(2))
	LocationServer                      // a configured location server, last resort (P(3), S(3))
)

// String names the kind.
func (k PlaceKind) String() string {
	switch k {
	case SecondaryOld:
		return "secondary's old location"
	case PrimaryOld:
		return "primary's old location"
	case LocationServer:
		return "location server"
	}
	return fmt.Sprintf("place kind %d", uint8(k))
}

// Place is one VCMP daemon to ask (at Addr, port 2031).
type Place struct {
	Kind PlaceKind
	Addr netip.Addr
}

// LocateOrder is the sequence of places a resumed end asks for its peer:
// the secondary's old location, then the primary's old location, then the
// location servers in the order given. selfOld and peerOld are the physical
// addresses this end and its peer had before the move. With no negotiated
// role an end is primary (§3.3.2.1), so two ends that never negotiated both
// ask each other's old place first: they cross, and meet later on the walk.
// Places named twice (both ends on one host) are asked once.
func LocateOrder(role Role, selfOld, peerOld netip.Addr, servers []netip.Addr) []Place {
	secondary, primary := peerOld, selfOld
	if role == RoleSecondary {
		secondary, primary = selfOld, peerOld
	}
	var out []Place
	seen := map[netip.Addr]bool{}
	add := func(k PlaceKind, a netip.Addr) {
		if a.IsValid() && !seen[a] {
			seen[a] = true
			out = append(out, Place{Kind: k, Addr: a})
		}
	}
	add(SecondaryOld, secondary)
	add(PrimaryOld, primary)
	for _, s := range servers {
		add(LocationServer, s)
	}
	return out
}

// Outcome is where a locate walk stands.
type Outcome uint8

// Outcomes.
const (
	// Continue: ask Next.
	Continue Outcome = iota
	// Found: the peer is at Locator.Peer; send it VNAT_UPD.
	Found
	// StoredOnly: the walk ended; the peer was nowhere, this end's location is
	// stored at Locator.Stored; wait suspended for the peer's VNAT_UPD.
	StoredOnly
	// Failed: no place answered; abort the migration.
	Failed
)

// Locator walks LocateOrder for one connection. At every place it sends a
// VCMP_LOC_QUERY with Store set: the place answers with the peer's location,
// or stores ours. Unlike the paper, which stops at the first place that
// stores, the walk goes on querying (and storing) at every later place until
// it finds the peer: two ends that stored at different places would
// otherwise wait for each other forever (both ends moved, no roles
// negotiated, both old places alive; TestLocateConvergesBothEndsMoving shows
// the paper's rule deadlocking there).
type Locator struct {
	Places []Place
	// Stored lists the places that stored this end's location.
	Stored []Place
	// Peer is the peer's location once the outcome is Found.
	Peer netip.AddrPort
	next int
	done Outcome
}

// NewLocator starts a walk over places.
func NewLocator(places []Place) *Locator { return &Locator{Places: places} }

// Next is the place to ask now; false when the walk is over.
func (l *Locator) Next() (Place, bool) {
	if l.done != Continue || l.next >= len(l.Places) {
		return Place{}, false
	}
	return l.Places[l.next], true
}

// Query is the VCMP_LOC_QUERY to send to every place of the walk.
func Query(r Record) *LocQuery { return &LocQuery{Record: r, Store: true} }

// Result records the answer from the place Next returned: a *LocAnswer, or
// nil when the place could not be reached or answered garbage.
func (l *Locator) Result(a *LocAnswer) Outcome {
	if l.done != Continue || l.next >= len(l.Places) {
		return l.done
	}
	p := l.Places[l.next]
	l.next++
	if a != nil {
		switch a.Status {
		case LocFound:
			if a.Peer.IsValid() {
				l.Peer, l.done = a.Peer, Found
				return Found
			}
		case LocStored:
			l.Stored = append(l.Stored, p)
		}
	}
	if l.next < len(l.Places) {
		return Continue
	}
	if len(l.Stored) > 0 {
		l.done = StoredOnly
	} else {
		l.done = Failed
	}
	return l.done
}

// GiveUp ends the walk as Failed, whatever places are left: the caller
// knows no later place can help (the peer is at its address and runs no
// VCMP at all).
func (l *Locator) GiveUp() Outcome {
	l.done = Failed
	return Failed
}

type dirKey struct {
	proto      Proto
	end, other netip.AddrPort
}

// RecordLifetime is how long a location record lives unless its end
// refreshes it (VCMP_LOC_STORE): a moved end that still needs its record
// stores it again every RefreshEvery; an end that closed or went away
// stops, and its record is gone a lifetime later. Both the daemons'
// directories and the location server keep records this long.
const RecordLifetime = 60 * time.Second

// RefreshEvery is how often an end refreshes the records it still needs: a
// third of a lifetime, so two lost refreshes in a row do not lose a record.
const RefreshEvery = RecordLifetime / 3

type dirEntry struct {
	at      netip.AddrPort
	expires time.Time
}

// Directory is the location records one VCMP daemon keeps as a place: the
// old location of its own moved ends, or the location server (paper
// §3.3.2.1: "VNAT does not leave states behind when a connection is
// suspended. It only stores the new location state at the old locations when
// a connection is resumed"). It is pure. Records expire Lifetime after they
// were last stored: an expired record answers nothing and is dropped.
type Directory struct {
	// Local reports where this host's own end of a connection is (the
	// connection seen from this host's end), if it is here: a place answers
	// for the ends it still holds without any stored record.
	Local func(conn Tuple) (netip.AddrPort, bool)
	// Lifetime of a record; zero is RecordLifetime.
	Lifetime time.Duration
	// Now is the clock; nil is time.Now.
	Now       func() time.Time
	records   map[dirKey]dirEntry
	lastSweep time.Time
}

// NewDirectory is an empty directory; local may be nil (a location server).
func NewDirectory(local func(Tuple) (netip.AddrPort, bool)) *Directory {
	return &Directory{Local: local, records: map[dirKey]dirEntry{}}
}

func (d *Directory) now() time.Time {
	if d.Now == nil {
		return time.Now()
	}
	return d.Now()
}

func (d *Directory) lifetime() time.Duration {
	if d.Lifetime <= 0 {
		return RecordLifetime
	}
	return d.Lifetime
}

// Len is the number of live records. Expired ones are swept first (at most
// once a second, so a caller checking a cap on every message pays a map walk
// only that often).
func (d *Directory) Len() int {
	if now := d.now(); now.Sub(d.lastSweep) >= time.Second || now.Before(d.lastSweep) {
		d.Sweep()
	}
	return len(d.records)
}

// Sweep drops every expired record and returns how many it dropped.
func (d *Directory) Sweep() int {
	now := d.now()
	d.lastSweep = now
	n := 0
	for k, e := range d.records {
		if !now.Before(e.expires) {
			delete(d.records, k)
			n++
		}
	}
	return n
}

// lookup is the live record under k; an expired one is dropped.
func (d *Directory) lookup(k dirKey) (netip.AddrPort, bool) {
	e, ok := d.records[k]
	if !ok {
		return netip.AddrPort{}, false
	}
	if !d.now().Before(e.expires) {
		delete(d.records, k)
		return netip.AddrPort{}, false
	}
	return e.at, true
}

func (d *Directory) store(r Record) {
	d.records[dirKey{r.Conn.Proto, r.Conn.Local, r.Conn.Remote}] = dirEntry{at: r.Phys, expires: d.now().Add(d.lifetime())}
}

// IsRelease reports whether a VCMP_LOC_STORE withdraws its record rather
// than storing one: L_Phys 0.0.0.0 port 0, "this end is nowhere any more"
// (its connection closed, or it is about to move again). It is answered
// status not found: nothing is stored for the end now.
func IsRelease(m *LocStore) bool {
	return m.Phys.Addr() == netip.IPv4Unspecified() && m.Phys.Port() == 0
}

// Release is the VCMP_LOC_STORE that withdraws the sender's record for conn.
func Release(conn Tuple) *LocStore {
	return &LocStore{Record: Record{Conn: conn, Phys: netip.AddrPortFrom(netip.IPv4Unspecified(), 0)}}
}

// Answer answers a VCMP_LOC_QUERY or VCMP_LOC_STORE. A query with Store set
// is atomic: either the sought end is known, or the sender's location is
// stored, so two ends asking the same place meet whichever asks first. A
// store (or a query's store) of a record already there refreshes it for
// another lifetime.
func (d *Directory) Answer(m Message) (*LocAnswer, error) {
	switch m := m.(type) {
	case *LocQuery:
		sought := m.Conn.Reverse() // the peer's view: its Local is the end we look for
		if d.Local != nil {
			if at, ok := d.Local(sought); ok {
				return &LocAnswer{Record: m.Record, Status: LocFound, Peer: at}, nil
			}
		}
		if at, ok := d.lookup(dirKey{sought.Proto, sought.Local, sought.Remote}); ok {
			return &LocAnswer{Record: m.Record, Status: LocFound, Peer: at}, nil
		}
		if !m.Store {
			return &LocAnswer{Record: m.Record, Status: LocNotFound}, nil
		}
		d.store(m.Record)
		return &LocAnswer{Record: m.Record, Status: LocStored}, nil
	case *LocStore:
		if IsRelease(m) {
			delete(d.records, dirKey{m.Conn.Proto, m.Conn.Local, m.Conn.Remote})
			return &LocAnswer{Record: m.Record, Status: LocNotFound}, nil
		}
		d.store(m.Record)
		return &LocAnswer{Record: m.Record, Status: LocStored}, nil
	case nil:
		return nil, fmt.Errorf("vcmp: directory: nil message")
	}
	return nil, fmt.Errorf("vcmp: directory: %s is not a location message", m.Command())
}

// Forget drops both ends' records of a connection (it migrated, or closed).
func (d *Directory) Forget(conn Tuple) {
	delete(d.records, dirKey{conn.Proto, conn.Local, conn.Remote})
	r := conn.Reverse()
	delete(d.records, dirKey{r.Proto, r.Local, r.Remote})
}
