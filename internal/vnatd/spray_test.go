package vnatd

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/vcmp"
)

// The ephemeral port range a sprayer walks (Linux's default
// ip_local_port_range).
const ephemeralLo, ephemeralHi = 32768, 60999

// spray is issue 20's attack: unkeyed VNAT_UPD for conn's peer end over
// every ephemeral port of the peer, each claiming the peer moved to the
// sprayer, in batches of 512 as one stream each, handed to nd's daemon
// as coming from the sprayer. It returns how many were answered OK.
func spray(nd *node, sprayer netip.Addr, peer netip.AddrPort, local netip.AddrPort) int {
	ok := 0
	var batch []vcmp.Message
	flush := func() {
		for _, a := range nd.e.HandleBatch(batch, sprayer) {
			if r, isReply := a.(*vcmp.UpdateReply); isReply && r.Status == vcmp.UpdateOK {
				ok++
			}
		}
		batch = batch[:0]
	}
	for port := ephemeralLo; port <= ephemeralHi; port++ {
		conn := vcmp.Tuple{Proto: vcmp.TCP, Local: netip.AddrPortFrom(peer.Addr(), uint16(port)), Remote: local}
		batch = append(batch, &vcmp.Update{Record: vcmp.Record{Conn: conn, Phys: netip.AddrPortFrom(sprayer, uint16(port))}})
		if len(batch) == 512 {
			flush()
		}
	}
	flush()
	return ok
}

// TestASprayOfUnkeyedUpdatesTakesNoConnection: b serves a connection from
// a peer that runs no daemon (10.0.9.9, never keyed) and one from a, keyed
// at first contact. The control first: a moves and b applies its keyed
// update (updates_applied). Then mallory sprays unkeyed updates for the
// unkeyed connection over the whole ephemeral port range (the attack took
// it over in 0.2 s with the old defaults): none is applied, b's connection
// keeps its peer, the first MissBurst are refused one by one and the rest
// throttled unread, and the throttle is logged a bounded number of times.
// a's next keyed update still goes through: only the sprayer is throttled.
func TestASprayOfUnkeyedUpdatesTakesNoConnection(t *testing.T) {
	n := newNetwork()
	clock := time.Unix(5000, 0)
	a := n.add(t, "a", "10.0.1.1", Config{})
	b := n.add(t, "b", "10.0.2.2", Config{Now: func() time.Time { return clock }})
	mallory := n.add(t, "mallory", "10.0.6.6", Config{})
	_, tb := connect(a, b, 40000)
	lone := vcmp.Tuple{Proto: vcmp.TCP, Local: netip.MustParseAddrPort("10.0.2.2:22"), Remote: netip.MustParseAddrPort("10.0.9.9:32800")}
	b.tr.open = append(b.tr.open, lone)
	syncAll(t, b)
	keyAll(t, a)
	if !state(t, b, tb).Keyed || state(t, b, lone).Keyed {
		t.Fatalf("b: %+v and %+v, want a's keyed and the lone one not", state(t, b, tb), state(t, b, lone))
	}

	old, new := n.move(a, "10.0.3.3")
	if err := a.e.Restore(t.Context(), old, new); err != nil {
		t.Fatal(err)
	}
	wantPhys(t, b, tb, b.addr, new)
	if c := b.e.Counters(); c["updates_applied"] != 1 {
		t.Fatalf("the control: b counters %v, want updates_applied 1", c)
	}

	if ok := spray(b, mallory.addr, lone.Remote, lone.Local); ok != 0 {
		t.Fatalf("the spray took %d updates", ok)
	}
	if p, ok := b.tr.phys(lone); ok {
		t.Fatalf("b translates the lone connection to %v after the spray", p)
	}
	c := b.e.Counters()
	total := uint64(ephemeralHi - ephemeralLo + 1)
	if c["refused_unkeyed"] != 1 || c["refused_unkeyed"]+c["refused_unknown"] != MissBurst || c["refused_throttled"] != total-MissBurst || c["sources_throttled"] != 1 {
		t.Fatalf("b counters %v: want %d refused one by one (the lone connection's port unkeyed, the others unknown), %d throttled, the source throttled once", c, MissBurst, total-MissBurst)
	}
	if k := strings.Count(b.logs.String(), "throttled"); k < 1 || k > 2 {
		t.Fatalf("the throttle logged %d times, want 1 or 2 (rate-limited):\n%s", k, b.logs.String())
	}

	// a moves again: its keyed update is taken, mallory's still not.
	old, new = n.move(a, "10.0.4.4")
	if err := a.e.Restore(t.Context(), old, new); err != nil {
		t.Fatal(err)
	}
	wantPhys(t, b, tb, b.addr, new)
	wantRefused(t, "mallory throttled", sendOne(t, n, mallory, b.addr, &vcmp.Update{Record: vcmp.Record{Conn: lone.Reverse(), Phys: netip.AddrPortFrom(mallory.addr, 1)}}))
	// Its budget comes back with time.
	clock = clock.Add(MissBurst / MissPerSecond * time.Second)
	before := b.e.Counters()["refused_throttled"]
	wantRefused(t, "mallory after its budget refilled", sendOne(t, n, mallory, b.addr, &vcmp.Update{Record: vcmp.Record{Conn: lone.Reverse(), Phys: netip.AddrPortFrom(mallory.addr, 1)}}))
	if got := b.e.Counters()["refused_throttled"]; got != before {
		t.Fatalf("refused_throttled %d after the budget refilled, want %d (refused for what it is)", got, before)
	}
}

// TestUnkeyedUpdatesOnlyFromThePeerAndRateLimited: with --allow-unkeyed a
// connection without keys follows an unkeyed update, but only from where
// its peer is (the control: the peer, behind the same address, changes
// port), at most UnkeyedBurst at once from one source; one from elsewhere
// is refused (refused_unkeyed_source) and a spray from elsewhere is
// throttled as by default.
func TestUnkeyedUpdatesOnlyFromThePeerAndRateLimited(t *testing.T) {
	n := newNetwork()
	clock := time.Unix(5000, 0)
	b := n.add(t, "b", "10.0.2.2", Config{AllowUnkeyed: true, Now: func() time.Time { return clock }})
	mallory := netip.MustParseAddr("10.0.6.6")
	peer := netip.MustParseAddr("10.0.9.9")
	var conns []vcmp.Tuple
	for i := range UnkeyedBurst + 1 {
		c := vcmp.Tuple{Proto: vcmp.TCP, Local: netip.MustParseAddrPort("10.0.2.2:22"), Remote: netip.AddrPortFrom(peer, uint16(40000+i))}
		conns = append(conns, c)
		b.tr.open = append(b.tr.open, c)
	}
	syncAll(t, b)
	upd := func(c vcmp.Tuple, at netip.AddrPort) vcmp.Message {
		return &vcmp.Update{Record: vcmp.Record{Conn: c.Reverse(), Phys: at}}
	}
	status := func(m vcmp.Message) vcmp.UpdateStatus { return m.(*vcmp.UpdateReply).Status }

	// From elsewhere: refused, whatever it claims.
	if st := status(b.e.Handle(upd(conns[0], netip.AddrPortFrom(mallory, 50000)), mallory)); st != vcmp.UpdateRefused {
		t.Fatalf("an unkeyed update from elsewhere than the peer: %d, want refused", st)
	}
	if c := b.e.Counters(); c["refused_unkeyed_source"] != 1 {
		t.Fatalf("counters %v, want refused_unkeyed_source 1", c)
	}
	// The control: the peer itself, at a new port.
	for i, c := range conns[:UnkeyedBurst] {
		to := netip.AddrPortFrom(peer, uint16(50000+i))
		if st := status(b.e.Handle(upd(c, to), peer)); st != vcmp.UpdateOK {
			t.Fatalf("the peer's unkeyed update %d: %d, want OK", i, st)
		}
		if p, _ := b.tr.phys(c); p.Remote != to {
			t.Fatalf("%v travels as %v, want to %v", c, p, to)
		}
	}
	if c := b.e.Counters(); c["updates_applied"] != UnkeyedBurst {
		t.Fatalf("counters %v, want updates_applied %d", c, UnkeyedBurst)
	}
	// One more at once is over the source's rate; a second later it is taken.
	last := conns[UnkeyedBurst]
	if st := status(b.e.Handle(upd(last, netip.AddrPortFrom(peer, 59999)), peer)); st != vcmp.UpdateRefused {
		t.Fatalf("unkeyed update %d at once: %d, want refused (rate)", UnkeyedBurst+1, st)
	}
	if c := b.e.Counters(); c["refused_unkeyed_rate"] != 1 {
		t.Fatalf("counters %v, want refused_unkeyed_rate 1", c)
	}
	clock = clock.Add(time.Second)
	if st := status(b.e.Handle(upd(last, netip.AddrPortFrom(peer, 59999)), peer)); st != vcmp.UpdateOK {
		t.Fatalf("the same update a second later: %d, want OK", st)
	}

	// A spray from elsewhere: nothing taken, the sprayer throttled.
	sprayer := &node{e: b.e}
	if ok := spray(sprayer, mallory, netip.AddrPortFrom(peer, 0), conns[0].Local); ok != 0 {
		t.Fatalf("the spray took %d updates", ok)
	}
	for i, c := range conns[:UnkeyedBurst] {
		if p, _ := b.tr.phys(c); p.Remote != netip.AddrPortFrom(peer, uint16(50000+i)) {
			t.Fatalf("%v now travels as %v after the spray", c, p)
		}
	}
	if c := b.e.Counters(); c["sources_throttled"] != 1 || c["refused_throttled"] == 0 {
		t.Fatalf("counters %v, want the sprayer throttled", c)
	}
}
