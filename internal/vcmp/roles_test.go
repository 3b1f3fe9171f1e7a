package vcmp

import (
	"errors"
	"reflect"
	"testing"
)

// conn builds a machine in a given configuration for the transition table.
func conn(s State, r Role, flags string) Conn {
	c := Conn{Tuple: clientConn, State: s, Role: r}
	for _, f := range flags {
		switch f {
		case 'a':
			c.Awaiting = true
		case 'm':
			c.Moving = true
		case 'h':
			c.Helper = true
		case 'u':
			c.Updating = true
		}
	}
	return c
}

// TestTransitions is the state machine, row by row: every (configuration,
// event) pair the daemon can meet, what it becomes and what it must do.
// Rows with want == nil expect ErrUnexpected and no change.
func TestTransitions(t *testing.T) {
	settled := conn(Migrated, RoleNone, "")
	none := []Action(nil)
	type row struct {
		name string
		from Conn
		ev   Event
		want *Conn
		acts []Action
	}
	p := func(c Conn) *Conn { return &c }
	rows := []row{
		// Active: the three ways a migration starts.
		{"active: about to move -> claims primary", conn(Active, RoleNone, ""), EvSuspend,
			p(conn(Suspended, RolePrimary, "am")), []Action{ActSendSuspPrimary, ActSendKey}},
		{"active: peer claims primary -> secondary, helper on", conn(Active, RoleNone, ""), EvRecvSuspPrimary,
			p(conn(Suspended, RoleSecondary, "h")), []Action{ActSendSuspSecondary, ActSendKey, ActStartHelper}},
		{"active: moved with no negotiation (pulled cable) -> primary by default", conn(Active, RoleNone, ""), EvResume,
			p(conn(Locating, RolePrimary, "m")), []Action{ActLocate}},
		{"active: unnegotiated peer's update -> migrated", conn(Active, RoleNone, ""), EvRecvUpdate,
			p(settled), []Action{ActApplyPeer, ActSendUpdateReply}},
		{"active: stray SECONDARY", conn(Active, RoleNone, ""), EvRecvSuspSecondary, nil, nil},
		{"active: stray timeout", conn(Active, RoleNone, ""), EvTimeout, nil, nil},
		{"active: stray found", conn(Active, RoleNone, ""), EvFound, nil, nil},
		{"active: stray stored", conn(Active, RoleNone, ""), EvStored, nil, nil},
		{"active: stray locate failure", conn(Active, RoleNone, ""), EvLocateFailed, nil, nil},
		{"active: stray UPD_R", conn(Active, RoleNone, ""), EvRecvUpdateReply, nil, nil},
		// Migrated behaves as active: a connection can move again.
		{"migrated: moves again -> claims primary", settled, EvSuspend,
			p(conn(Suspended, RolePrimary, "am")), []Action{ActSendSuspPrimary, ActSendKey}},
		{"migrated: peer moves again -> secondary", settled, EvRecvSuspPrimary,
			p(conn(Suspended, RoleSecondary, "h")), []Action{ActSendSuspSecondary, ActSendKey, ActStartHelper}},
		// Suspended, awaiting the answer to our PRIMARY.
		{"awaiting: SECONDARY answers -> primary confirmed", conn(Suspended, RolePrimary, "am"), EvRecvSuspSecondary,
			p(conn(Suspended, RolePrimary, "m")), none},
		{"awaiting: timeout -> primary by default", conn(Suspended, RolePrimary, "am"), EvTimeout,
			p(conn(Suspended, RolePrimary, "m")), none},
		{"awaiting: resumed before any answer -> primary, locating", conn(Suspended, RolePrimary, "am"), EvResume,
			p(conn(Locating, RolePrimary, "m")), []Action{ActLocate}},
		{"awaiting: suspend again is a no-op", conn(Suspended, RolePrimary, "am"), EvSuspend,
			p(conn(Suspended, RolePrimary, "am")), none},
		{"awaiting: update while we leave", conn(Suspended, RolePrimary, "am"), EvRecvUpdate, nil, nil},
		// Crossing PRIMARYs (figure 3-4(b)): clientConn's local end 10.10.10.10
		// is lower than 20.20.20.20, so the client side loses and the server
		// side wins; neither sends anything more.
		{"crossing PRIMARY at the lower end -> secondary", conn(Suspended, RolePrimary, "am"), EvRecvSuspPrimary,
			p(conn(Suspended, RoleSecondary, "m")), none},
		{"crossing PRIMARY at the higher end -> stays primary", func() Conn { c := conn(Suspended, RolePrimary, "am"); c.Tuple = serverConn; return c }(), EvRecvSuspPrimary,
			p(func() Conn { c := conn(Suspended, RolePrimary, "m"); c.Tuple = serverConn; return c }()), none},
		// Suspended, roles settled.
		{"secondary: peer's update -> migrated, helper off", conn(Suspended, RoleSecondary, "h"), EvRecvUpdate,
			p(settled), []Action{ActApplyPeer, ActSendUpdateReply, ActStopHelper}},
		{"secondary: PRIMARY retransmitted -> answered again", conn(Suspended, RoleSecondary, "h"), EvRecvSuspPrimary,
			p(conn(Suspended, RoleSecondary, "h")), []Action{ActSendSuspSecondary, ActSendKey}},
		{"secondary: moves too (§4.2) -> keeps its role", conn(Suspended, RoleSecondary, "h"), EvSuspend,
			p(conn(Suspended, RoleSecondary, "hm")), none},
		{"secondary: resumed at a new place -> locating as secondary", conn(Suspended, RoleSecondary, "hm"), EvResume,
			p(conn(Locating, RoleSecondary, "hm")), []Action{ActLocate}},
		{"moving secondary: PRIMARY again", conn(Suspended, RoleSecondary, "hm"), EvRecvSuspPrimary, nil, nil},
		{"primary: resumed -> locating", conn(Suspended, RolePrimary, "m"), EvResume,
			p(conn(Locating, RolePrimary, "m")), []Action{ActLocate}},
		{"primary waiting after storing: peer's update -> migrated", conn(Suspended, RolePrimary, "m"), EvRecvUpdate,
			p(settled), []Action{ActApplyPeer, ActSendUpdateReply}},
		{"primary: second SECONDARY", conn(Suspended, RolePrimary, "m"), EvRecvSuspSecondary, nil, nil},
		{"primary: PRIMARY after roles settled", conn(Suspended, RolePrimary, "m"), EvRecvSuspPrimary, nil, nil},
		{"suspended: stray found", conn(Suspended, RolePrimary, "m"), EvFound, nil, nil},
		{"suspended: stray UPD_R", conn(Suspended, RolePrimary, "m"), EvRecvUpdateReply, nil, nil},
		// Locating.
		{"locating: found -> send update", conn(Locating, RolePrimary, "m"), EvFound,
			p(conn(Locating, RolePrimary, "mu")), []Action{ActSendUpdate}},
		{"locating: UPD_R -> migrated", conn(Locating, RolePrimary, "mu"), EvRecvUpdateReply,
			p(settled), []Action{ActApplyPeer}},
		{"locating secondary with helper: UPD_R -> migrated, helper off", conn(Locating, RoleSecondary, "hmu"), EvRecvUpdateReply,
			p(settled), []Action{ActApplyPeer, ActStopHelper}},
		{"locating: UPD_R before any update", conn(Locating, RolePrimary, "m"), EvRecvUpdateReply, nil, nil},
		{"locating: stored only -> suspended, waits", conn(Locating, RolePrimary, "m"), EvStored,
			p(conn(Suspended, RolePrimary, "m")), none},
		{"locating: nowhere -> aborted", conn(Locating, RolePrimary, "m"), EvLocateFailed,
			p(conn(Aborted, RolePrimary, "m")), none},
		{"locating with helper: nowhere -> aborted, helper off", conn(Locating, RoleSecondary, "hm"), EvLocateFailed,
			p(conn(Aborted, RoleSecondary, "m")), []Action{ActStopHelper}},
		{"locating: peer found us first -> migrated", conn(Locating, RoleSecondary, "m"), EvRecvUpdate,
			p(settled), []Action{ActApplyPeer, ActSendUpdateReply}},
		{"locating: address changed again -> start over", conn(Locating, RolePrimary, "mu"), EvResume,
			p(conn(Locating, RolePrimary, "m")), []Action{ActLocate}},
		{"locating: suspend", conn(Locating, RolePrimary, "m"), EvSuspend, nil, nil},
		{"locating: PRIMARY", conn(Locating, RolePrimary, "m"), EvRecvSuspPrimary, nil, nil},
		{"updating: stored", conn(Locating, RolePrimary, "mu"), EvStored, nil, nil},
		{"updating: failed", conn(Locating, RolePrimary, "mu"), EvLocateFailed, nil, nil},
		// Aborted is terminal.
		{"aborted: update", conn(Aborted, RolePrimary, "m"), EvRecvUpdate, nil, nil},
		{"aborted: resume", conn(Aborted, RolePrimary, "m"), EvResume, nil, nil},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			c := r.from
			acts, err := c.Step(r.ev)
			if r.want == nil {
				if !errors.Is(err, ErrUnexpected) {
					t.Fatalf("error %v, want ErrUnexpected", err)
				}
				if c != r.from || acts != nil {
					t.Fatalf("a refused event changed the connection to %+v or asked for %v", c, acts)
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if c != *r.want {
				t.Errorf("became %+v\n      want %+v", c, *r.want)
			}
			if !reflect.DeepEqual(acts, r.acts) {
				t.Errorf("actions %v, want %v", acts, r.acts)
			}
		})
	}
}

func TestEveryEventInEveryStateIsDecided(t *testing.T) {
	// No (state, event) pair panics or leaves the machine in an unnamed state.
	for s := Active; s <= Aborted; s++ {
		for _, r := range []Role{RoleNone, RolePrimary, RoleSecondary} {
			for _, flags := range []string{"", "a", "m", "h", "u", "am", "hm", "mu", "hmu"} {
				for ev := EvSuspend; ev <= EvRecvUpdateReply; ev++ {
					c := conn(s, r, flags)
					if _, err := c.Step(ev); err != nil && !errors.Is(err, ErrUnexpected) {
						t.Fatalf("%s/%s/%q on %s: %v", s, r, flags, ev, err)
					}
					if c.State > Aborted || c.Role > RoleSecondary {
						t.Fatalf("%s/%s/%q on %s: became %+v", s, r, flags, ev, c)
					}
				}
			}
		}
	}
}

func TestArbitrateHigherAddressWins(t *testing.T) {
	cases := []struct {
		local, remote string
		want          Role
	}{
		{"10.10.10.10:40000", "20.20.20.20:22", RoleSecondary},
		{"20.20.20.20:22", "10.10.10.10:40000", RolePrimary},
		{"10.0.0.2:1", "10.0.0.10:65535", RoleSecondary}, // numeric, not string, order
		{"10.0.0.1:5000", "10.0.0.1:22", RolePrimary},    // one host: the port decides
		{"10.0.0.1:22", "10.0.0.1:5000", RoleSecondary},
	}
	for _, c := range cases {
		tu := Tuple{TCP, ap(c.local), ap(c.remote)}
		if got := Arbitrate(tu); got != c.want {
			t.Errorf("%v: %s, want %s", tu, got, c.want)
		}
		if got, other := Arbitrate(tu), Arbitrate(tu.Reverse()); got == other {
			t.Errorf("%v: both ends decide %s", tu, got)
		}
	}
}

// pair is both ends of one connection, joined by in-order message queues.
type pair struct {
	c, s *Conn
}

func newPair() *pair {
	return &pair{c: NewConn(clientConn), s: NewConn(serverConn)}
}

func step(t *testing.T, c *Conn, ev Event) []Action {
	t.Helper()
	acts, err := c.Step(ev)
	if err != nil {
		t.Fatal(err)
	}
	return acts
}

// recv turns a send action into the event the other end sees.
func recv(acts []Action) []Event {
	var evs []Event
	for _, a := range acts {
		switch a {
		case ActSendSuspPrimary:
			evs = append(evs, EvRecvSuspPrimary)
		case ActSendSuspSecondary:
			evs = append(evs, EvRecvSuspSecondary)
		}
	}
	return evs
}

func TestLoneMoverIsAlwaysPrimary(t *testing.T) {
	for _, mover := range []string{"client (lower address)", "server (higher address)"} {
		t.Run(mover, func(t *testing.T) {
			p := newPair()
			m, o := p.c, p.s
			if mover[0] == 's' {
				m, o = p.s, p.c
			}
			out := step(t, m, EvSuspend)
			var back []Action
			for _, ev := range recv(out) {
				back = append(back, step(t, o, ev)...)
			}
			for _, ev := range recv(back) {
				step(t, m, ev)
			}
			if m.Role != RolePrimary || o.Role != RoleSecondary || !o.Helper {
				t.Fatalf("mover %+v, other %+v: want primary and secondary with its helper", m, o)
			}
		})
	}
}

// TestCrossingPrimariesFromBothSides: both ends claim primary at once; each
// sees the other's claim while awaiting its own answer. Whichever side's
// claim is processed first, the higher address ends primary, the lower
// secondary, and no further message is sent.
func TestCrossingPrimariesFromBothSides(t *testing.T) {
	for _, first := range []string{"client first", "server first"} {
		t.Run(first, func(t *testing.T) {
			p := newPair()
			toServer := step(t, p.c, EvSuspend)
			toClient := step(t, p.s, EvSuspend)
			order := []struct {
				c   *Conn
				evs []Event
			}{{p.s, recv(toServer)}, {p.c, recv(toClient)}}
			if first[0] == 's' {
				order[0], order[1] = order[1], order[0]
			}
			for _, o := range order {
				for _, ev := range o.evs {
					if acts := step(t, o.c, ev); len(acts) != 0 {
						t.Fatalf("arbitration sent %v; the paper sends nothing more", acts)
					}
				}
			}
			if p.s.Role != RolePrimary || p.c.Role != RoleSecondary {
				t.Fatalf("server (20.20.20.20) %s, client (10.10.10.10) %s: want the higher address primary", p.s.Role, p.c.Role)
			}
			if p.s.Awaiting || p.c.Awaiting || p.s.Helper || p.c.Helper {
				t.Fatalf("after arbitration: server %+v client %+v", p.s, p.c)
			}
		})
	}
}

func TestNoNegotiationBothDefaultToPrimary(t *testing.T) {
	p := newPair()
	// A pulled cable: neither end heard of a suspension; both resume moved.
	step(t, p.c, EvResume)
	step(t, p.s, EvResume)
	if p.c.Role != RolePrimary || p.s.Role != RolePrimary {
		t.Fatalf("client %s, server %s: want both primary", p.c.Role, p.s.Role)
	}
	// A PRIMARY that got no answer before the move: primary too.
	q := newPair()
	step(t, q.c, EvSuspend)
	step(t, q.c, EvTimeout)
	if q.c.Role != RolePrimary {
		t.Fatalf("after a timeout: %s, want primary", q.c.Role)
	}
}
