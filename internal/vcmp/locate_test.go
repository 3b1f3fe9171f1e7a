package vcmp

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"
)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func TestLocateOrder(t *testing.T) {
	self, peer := ip("10.10.10.10"), ip("20.20.20.20")
	servers := []netip.Addr{ip("10.0.0.1"), ip("10.0.0.2")}
	cases := []struct {
		name string
		role Role
		self netip.Addr
		srv  []netip.Addr
		want []Place
	}{
		{"primary: secondary's (the peer's) old place first", RolePrimary, self, servers,
			[]Place{{SecondaryOld, peer}, {PrimaryOld, self}, {LocationServer, servers[0]}, {LocationServer, servers[1]}}},
		{"secondary: its own old place first", RoleSecondary, self, servers,
			[]Place{{SecondaryOld, self}, {PrimaryOld, peer}, {LocationServer, servers[0]}, {LocationServer, servers[1]}}},
		{"no role: as primary", RoleNone, self, nil,
			[]Place{{SecondaryOld, peer}, {PrimaryOld, self}}},
		{"both ends on one host: asked once", RolePrimary, peer, servers[:1],
			[]Place{{SecondaryOld, peer}, {LocationServer, servers[0]}}},
		{"a server that is an old place: asked once", RoleSecondary, self, []netip.Addr{peer, servers[0], servers[0]},
			[]Place{{SecondaryOld, self}, {PrimaryOld, peer}, {LocationServer, servers[0]}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := LocateOrder(c.role, c.self, peer, c.srv)
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %v\nwant %v", got, c.want)
			}
		})
	}
}

func TestLocatorWalk(t *testing.T) {
	places := LocateOrder(RolePrimary, ip("10.10.10.10"), ip("20.20.20.20"), []netip.Addr{ip("10.0.0.1")})
	found := &LocAnswer{Status: LocFound, Peer: ap("40.40.40.40:22")}
	stored := &LocAnswer{Status: LocStored}
	refused := &LocAnswer{Status: LocRefused}
	cases := []struct {
		name    string
		answers []*LocAnswer // nil: unreachable
		want    []Outcome
		stored  int
	}{
		{"found at the first place", []*LocAnswer{found}, []Outcome{Found}, 0},
		{"stored first, found later: the walk goes on after storing", []*LocAnswer{stored, found}, []Outcome{Continue, Found}, 1},
		{"stored everywhere: wait", []*LocAnswer{stored, nil, stored}, []Outcome{Continue, Continue, StoredOnly}, 2},
		{"nobody answers: abort", []*LocAnswer{nil, nil, nil}, []Outcome{Continue, Continue, Failed}, 0},
		{"refused everywhere: abort", []*LocAnswer{refused, refused, refused}, []Outcome{Continue, Continue, Failed}, 0},
		{"a found answer without a location is no answer", []*LocAnswer{{Status: LocFound}, nil, stored}, []Outcome{Continue, Continue, StoredOnly}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := NewLocator(places)
			for i, a := range c.answers {
				if _, ok := l.Next(); !ok {
					t.Fatalf("walk over before answer %d", i)
				}
				if got := l.Result(a); got != c.want[i] {
					t.Fatalf("answer %d: %v, want %v", i, got, c.want[i])
				}
			}
			if _, ok := l.Next(); ok {
				t.Fatal("the walk goes on after its outcome")
			}
			if len(l.Stored) != c.stored {
				t.Fatalf("stored at %v, want %d places", l.Stored, c.stored)
			}
		})
	}
}

func TestDirectory(t *testing.T) {
	aNew, bNew := ap("30.30.30.30:40000"), ap("40.40.40.40:22")
	d := NewDirectory(nil)
	qa := &LocQuery{Record: Record{Conn: clientConn, Phys: aNew}, Store: true}
	qb := &LocQuery{Record: Record{Conn: serverConn, Phys: bNew}, Store: true}
	if a, err := d.Answer(&LocQuery{Record: qa.Record}); err != nil || a.Status != LocNotFound || d.Len() != 0 {
		t.Fatalf("plain query on an empty directory: %+v %v, %d records", a, err, d.Len())
	}
	if a, err := d.Answer(qa); err != nil || a.Status != LocStored || a.Record != qa.Record {
		t.Fatalf("client's query-or-store: %+v %v", a, err)
	}
	if a, err := d.Answer(qb); err != nil || a.Status != LocFound || a.Peer != aNew {
		t.Fatalf("server's query after the client stored: %+v %v, want found at %v", a, err, aNew)
	}
	// A different connection between the same hosts knows nothing.
	other := &LocQuery{Record: Record{Conn: Tuple{TCP, ap("20.20.20.20:22"), ap("10.10.10.10:40001")}, Phys: bNew}}
	if a, _ := d.Answer(other); a.Status != LocNotFound {
		t.Fatalf("another connection's query: %+v", a)
	}
	if a, _ := d.Answer(&LocStore{Record{Conn: serverConn, Phys: bNew}}); a.Status != LocStored {
		t.Fatalf("store: %+v", a)
	}
	if a, _ := d.Answer(&LocQuery{Record: qa.Record}); a.Status != LocFound || a.Peer != bNew {
		t.Fatalf("client's query after the server stored: %+v", a)
	}
	d.Forget(clientConn)
	if d.Len() != 0 {
		t.Fatalf("%d records left after Forget", d.Len())
	}
	// A place holding the sought end answers for it without a record.
	here := NewDirectory(func(c Tuple) (netip.AddrPort, bool) { return server, c == serverConn })
	if a, _ := here.Answer(&LocQuery{Record: qa.Record}); a.Status != LocFound || a.Peer != server {
		t.Fatalf("the stationary peer's own place: %+v", a)
	}
	if _, err := here.Answer(&Update{}); err == nil {
		t.Fatal("an update was answered as a location message")
	}
}

// How an end moves in the simulation.
type move uint8

const (
	stays   move = iota // does not move; its place holds the connection
	process             // the process moved; the old host's daemon is still there
	host                // the whole host moved; nothing answers at the old address
)

func (m move) String() string { return [...]string{"stays", "process moved", "host moved"}[m] }

// world is a fake network of VCMP places: an address answers when it has a
// Directory.
type world map[netip.Addr]*Directory

// end is one end of the connection in the simulation.
type end struct {
	conn     Tuple
	old, new netip.AddrPort
	loc      *Locator
	outcome  Outcome
}

func (e *end) step(w world, stopAtFirstStore bool) {
	p, ok := e.loc.Next()
	if !ok {
		return
	}
	var ans *LocAnswer
	if d := w[p.Addr]; d != nil {
		a, err := d.Answer(Query(Record{Conn: e.conn, Phys: e.new}))
		if err != nil {
			panic(err)
		}
		ans = a
	}
	e.outcome = e.loc.Result(ans)
	if stopAtFirstStore && e.outcome == Continue && ans != nil && ans.Status == LocStored {
		// The paper's P(1): "If successful, the procedure finishes".
		e.outcome, e.loc.done = StoredOnly, StoredOnly
	}
}

type simResult struct {
	converged bool   // one end found the other's new place
	wrong     string // an end found a place that is not its peer's
	deadlock  bool   // both ends wait, stored, for each other
	aborted   bool   // both ends gave up
}

// simulate runs both ends' walks interleaved by schedule (bit i: which end
// takes the i-th step) and reports how it ended.
func simulate(a, b move, roles [2]Role, withServer bool, schedule uint, stopAtFirstStore bool) simResult {
	w := world{}
	A := &end{conn: clientConn, old: client, new: ap("30.30.30.30:40000")}
	B := &end{conn: serverConn, old: server, new: ap("40.40.40.40:22")}
	var srv []netip.Addr
	if withServer {
		srv = []netip.Addr{ip("10.0.0.1")}
		w[srv[0]] = NewDirectory(nil)
	}
	for _, x := range []struct {
		e *end
		m move
	}{{A, a}, {B, b}} {
		switch x.m {
		case stays:
			x.e.new = x.e.old
			e := x.e
			w[e.old.Addr()] = NewDirectory(func(c Tuple) (netip.AddrPort, bool) { return e.new, c == e.conn })
		case process:
			w[x.e.old.Addr()] = NewDirectory(nil)
		}
	}
	walkers := []*end{}
	for i, x := range []struct {
		e *end
		m move
	}{{A, a}, {B, b}} {
		if x.m != stays {
			x.e.loc = NewLocator(LocateOrder(roles[i], x.e.old.Addr(), peerOf(x.e, A, B).old.Addr(), srv))
			walkers = append(walkers, x.e)
		}
	}
	for i := 0; i < 16; i++ {
		e := walkers[0]
		if len(walkers) == 2 && schedule&(1<<i) != 0 {
			e = walkers[1]
		}
		if _, ok := e.loc.Next(); !ok {
			e = walkers[len(walkers)-1-indexOf(walkers, e)]
		}
		e.step(w, stopAtFirstStore)
	}
	var r simResult
	for _, e := range walkers {
		if _, ok := e.loc.Next(); ok {
			panic("a walk did not finish in 16 steps")
		}
		if e.outcome == Found {
			if e.loc.Peer != peerOf(e, A, B).new {
				r.wrong = fmt.Sprintf("%v found its peer at %v, it is at %v", e.conn, e.loc.Peer, peerOf(e, A, B).new)
			}
			r.converged = true
		}
	}
	if !r.converged {
		stored, failed := 0, 0
		for _, e := range walkers {
			switch e.outcome {
			case StoredOnly:
				stored++
			case Failed:
				failed++
			}
		}
		r.deadlock = stored == len(walkers) && len(walkers) == 2
		r.aborted = failed > 0
	}
	return r
}

func peerOf(e, a, b *end) *end {
	if e == a {
		return b
	}
	return a
}

func indexOf(es []*end, e *end) int {
	for i, x := range es {
		if x == e {
			return i
		}
	}
	return -1
}

// TestLocateConvergesBothEndsMoving runs every combination of how each end
// moves (stays, its process moves, its host moves), negotiated or default
// roles, with and without a location server, under every interleaving of the
// two walks: the ends find each other whenever any place is left to meet at,
// and otherwise both abort rather than wait forever. It also shows why the
// walk does not stop at the first store as the paper's P(1) does: with no
// negotiated roles and both old places alive, that rule leaves both ends
// waiting for each other.
func TestLocateConvergesBothEndsMoving(t *testing.T) {
	roleSets := map[string][2]Role{
		"client primary":          {RolePrimary, RoleSecondary},
		"server primary":          {RoleSecondary, RolePrimary},
		"no negotiation (both P)": {RoleNone, RoleNone},
	}
	paperDeadlocks := 0
	runs := 0
	for _, a := range []move{stays, process, host} {
		for _, b := range []move{stays, process, host} {
			if a == stays && b == stays {
				continue
			}
			for rname, roles := range roleSets {
				for _, server := range []bool{false, true} {
					anyPlace := server || a != host || b != host
					for schedule := uint(0); schedule < 1<<6; schedule++ {
						runs++
						name := fmt.Sprintf("client %s, server %s, %s, location server %v, schedule %06b", a, b, rname, server, schedule)
						r := simulate(a, b, roles, server, schedule, false)
						if r.wrong != "" {
							t.Fatalf("%s: %s", name, r.wrong)
						}
						if anyPlace && !r.converged {
							t.Fatalf("%s: did not converge (%+v)", name, r)
						}
						if !anyPlace && (r.converged || !r.aborted) {
							t.Fatalf("%s: with no place left to meet: %+v, want both to abort", name, r)
						}
						if p := simulate(a, b, roles, server, schedule, true); p.deadlock {
							paperDeadlocks++
							if roles[0] != RoleNone {
								t.Errorf("%s: the paper's rule deadlocks even with negotiated roles", name)
							}
						}
					}
				}
			}
		}
	}
	if paperDeadlocks == 0 {
		t.Fatal("the paper's stop-at-first-store rule never deadlocked: the simulation cannot tell the two rules apart")
	}
	t.Logf("%d runs converged as expected; the paper's rule deadlocked in %d of them", runs, paperDeadlocks)
}

// TestPaperExampleMigrateClientHostAndServerProcess is §4.2 step by step:
// the server (primary, higher address) process moves to 40.40.40.40 and
// resumes first; the whole client host moves to 30.30.30.30 and resumes
// later.
func TestPaperExampleMigrateClientHostAndServerProcess(t *testing.T) {
	w := world{server.Addr(): NewDirectory(nil)} // the old server host stays; the old client host is gone
	srv := &end{conn: serverConn, old: server, new: ap("40.40.40.40:22")}
	cli := &end{conn: clientConn, old: client, new: ap("30.30.30.30:40000")}
	srv.loc = NewLocator(LocateOrder(RolePrimary, server.Addr(), client.Addr(), nil))
	srv.step(w, false) // step 1: the client's old place does not answer
	if srv.outcome != Continue {
		t.Fatalf("step 1: %v", srv.outcome)
	}
	srv.step(w, false) // step 2: its own old place stores its new location
	if srv.outcome != StoredOnly || len(srv.loc.Stored) != 1 || srv.loc.Stored[0].Addr != server.Addr() {
		t.Fatalf("step 2: %v, stored at %v", srv.outcome, srv.loc.Stored)
	}
	cli.loc = NewLocator(LocateOrder(RoleSecondary, client.Addr(), server.Addr(), nil))
	cli.step(w, false) // the secondary's own old place is gone with its host
	cli.step(w, false) // step 3: the server's old place knows the new one
	if cli.outcome != Found || cli.loc.Peer != srv.new {
		t.Fatalf("step 3: %v at %v, want found at %v", cli.outcome, cli.loc.Peer, srv.new)
	}
}

// TestDirectoryRecordsExpireAndRefresh: a record answers for its lifetime
// and not a moment longer; storing it again (the end's refresh) keeps it; a
// release withdraws it at once; Len counts only live records.
func TestDirectoryRecordsExpireAndRefresh(t *testing.T) {
	now := time.Unix(1000, 0)
	d := NewDirectory(nil)
	d.Now = func() time.Time { return now }
	d.Lifetime = 10 * time.Second
	conn := Tuple{Proto: TCP, Local: netip.MustParseAddrPort("10.0.0.1:4000"), Remote: netip.MustParseAddrPort("10.0.0.2:22")}
	at := netip.MustParseAddrPort("30.0.0.1:4000")
	if a, err := d.Answer(&LocStore{Record: Record{Conn: conn, Phys: at}}); err != nil || a.Status != LocStored {
		t.Fatalf("store: %v %v", a, err)
	}
	ask := func() LocStatus {
		t.Helper()
		a, err := d.Answer(&LocQuery{Record: Record{Conn: conn.Reverse(), Phys: netip.MustParseAddrPort("10.0.0.2:22")}})
		if err != nil {
			t.Fatal(err)
		}
		if a.Status == LocFound && a.Peer != at {
			t.Fatalf("found at %v, want %v", a.Peer, at)
		}
		return a.Status
	}
	now = now.Add(9 * time.Second)
	if st := ask(); st != LocFound {
		t.Fatalf("9 s into a 10 s lifetime: status %d, want found", st)
	}
	// The refresh: stored again, it lives another lifetime from now.
	if _, err := d.Answer(&LocStore{Record: Record{Conn: conn, Phys: at}}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(9 * time.Second)
	if st := ask(); st != LocFound {
		t.Fatalf("9 s after a refresh: status %d, want found", st)
	}
	if d.Len() != 1 {
		t.Fatalf("Len %d, want 1", d.Len())
	}
	now = now.Add(time.Second)
	if st := ask(); st != LocNotFound {
		t.Fatalf("a lifetime after the refresh: status %d, want not found (expired)", st)
	}
	if d.Len() != 0 {
		t.Fatalf("Len %d after expiry, want 0", d.Len())
	}
	// A release withdraws at once.
	if _, err := d.Answer(&LocStore{Record: Record{Conn: conn, Phys: at}}); err != nil {
		t.Fatal(err)
	}
	if a, err := d.Answer(Release(conn)); err != nil || a.Status != LocNotFound {
		t.Fatalf("release: %v %v, want status not found", a, err)
	}
	if st := ask(); st != LocNotFound {
		t.Fatalf("after a release: status %d, want not found", st)
	}
	// Len sweeps: records expiring unseen are not counted.
	for i := range 5 {
		c := conn
		c.Local = netip.AddrPortFrom(c.Local.Addr(), uint16(5000+i))
		if _, err := d.Answer(&LocStore{Record: Record{Conn: c, Phys: at}}); err != nil {
			t.Fatal(err)
		}
	}
	if d.Len() != 5 {
		t.Fatalf("Len %d, want 5", d.Len())
	}
	now = now.Add(11 * time.Second)
	if d.Len() != 0 {
		t.Fatalf("Len %d a lifetime later, want 0", d.Len())
	}
}
