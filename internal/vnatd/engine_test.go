package vnatd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/vcmp"
)

// fakeTr is a datapath: the connections open at an end and what was
// translated, in memory.
type fakeTr struct {
	mu    sync.Mutex
	open  []vcmp.Tuple
	xlate map[vcmp.Tuple]vcmp.Tuple
	kept  []netip.Addr
	calls int // Translate calls
	// accepted are the ingress halves Accept installed, by virtual tuple.
	accepted map[vcmp.Tuple]vcmp.Tuple
	// onTranslate, if set, is called (without mu) before each Translate
	// with the mappings it installs.
	onTranslate func([]Mapping)
	// socketsClosed are the sockets CloseSocket closed; closeErr, if set,
	// is its answer instead (a kernel that cannot).
	socketsClosed []vcmp.Tuple
	closeErr      error
}

func (f *fakeTr) CloseSocket(v vcmp.Tuple) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closeErr != nil {
		return f.closeErr
	}
	f.socketsClosed = append(f.socketsClosed, v)
	return nil
}

func (f *fakeTr) Conns() ([]Mapping, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Mapping
	for _, t := range f.open {
		p, ok := f.xlate[t]
		if !ok {
			p = t
		}
		out = append(out, Mapping{Virtual: t, Physical: p})
	}
	return out, nil
}

func (f *fakeTr) Translate(ms []Mapping) error {
	if f.onTranslate != nil {
		f.onTranslate(ms)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	for _, m := range ms {
		f.xlate[m.Virtual] = m.Physical
		delete(f.accepted, m.Virtual)
	}
	return nil
}

func (f *fakeTr) Accept(ms []Mapping) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.accepted == nil {
		f.accepted = map[vcmp.Tuple]vcmp.Tuple{}
	}
	for _, m := range ms {
		f.accepted[m.Virtual] = m.Physical
	}
	return nil
}

func (f *fakeTr) Unaccept(vs []vcmp.Tuple) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, v := range vs {
		delete(f.accepted, v)
	}
	return nil
}

// accepts says whether packets of v arriving as phys reach its socket: the
// translation or an accepted ingress half.
func (f *fakeTr) accepts(v, phys vcmp.Tuple) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.xlate[v] == phys || f.accepted[v] == phys
}

func (f *fakeTr) KeepLocal(a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Contains(f.kept, a) {
		f.kept = append(f.kept, a)
	}
	return nil
}

func (f *fakeTr) Forget(v vcmp.Tuple) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.xlate, v)
	delete(f.accepted, v)
	return nil
}

func (f *fakeTr) close(v vcmp.Tuple) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.open = slices.DeleteFunc(f.open, func(t vcmp.Tuple) bool { return t == v })
}

func (f *fakeTr) phys(t vcmp.Tuple) (vcmp.Tuple, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.xlate[t]
	return p, ok
}

// network is a set of daemons reachable at their current addresses; a
// stream is a net.Pipe served by the daemon dialled.
type network struct {
	mu    sync.Mutex
	at    map[netip.Addr]*node
	dials map[netip.Addr]int
	// gate, when set, holds every dial until it is closed (to make two
	// suspends cross).
	gate chan struct{}
	wait *sync.WaitGroup
	// drop fails the next dials to an address (lost SYNs); lose lets the
	// next streams to an address reach its daemon but loses the answers.
	drop, lose map[netip.Addr]int
	// dialed records when each address was dialled.
	dialed map[netip.Addr][]time.Time
	// refuse makes dials to an address fail with ECONNREFUSED (a host
	// there, but no VCMP daemon).
	refuse map[netip.Addr]bool
	// before, if set for an address, runs once (without the network's
	// lock) at the next dial to it, before that dial goes on.
	before map[netip.Addr]func()
	// serve, if set for an address, answers streams to it instead of a
	// daemon (a place that lies).
	serve map[netip.Addr]vcmp.BatchHandler
	// nat rewrites the source of streams from an address (a node behind a
	// NAT): their daemons see them come from the NAT's address.
	nat map[netip.Addr]netip.Addr
}

type node struct {
	name string
	addr netip.Addr
	tr   *fakeTr
	e    *Engine
	logs *bytes.Buffer
}

func newNetwork() *network {
	return &network{at: map[netip.Addr]*node{}, dials: map[netip.Addr]int{},
		drop: map[netip.Addr]int{}, lose: map[netip.Addr]int{}, dialed: map[netip.Addr][]time.Time{},
		refuse: map[netip.Addr]bool{}, before: map[netip.Addr]func(){}, serve: map[netip.Addr]vcmp.BatchHandler{},
		nat: map[netip.Addr]netip.Addr{}}
}

func (n *network) add(t testing.TB, name, addr string, cfg Config) *node {
	t.Helper()
	nd := &node{name: name, addr: netip.MustParseAddr(addr), tr: &fakeTr{xlate: map[vcmp.Tuple]vcmp.Tuple{}}, logs: &bytes.Buffer{}}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(nd.logs, nil))
	}
	nd.e = New(cfg, nd.tr, func(ctx context.Context, a netip.Addr) (io.ReadWriteCloser, error) {
		return n.dial(ctx, nd, a)
	})
	n.mu.Lock()
	n.at[nd.addr] = nd
	n.mu.Unlock()
	return nd
}

func (n *network) dial(_ context.Context, from *node, a netip.Addr) (io.ReadWriteCloser, error) {
	n.mu.Lock()
	if f := n.before[a]; f != nil {
		delete(n.before, a)
		n.mu.Unlock()
		f()
		n.mu.Lock()
	}
	if n.refuse[a] {
		n.dials[a]++
		n.mu.Unlock()
		return nil, fmt.Errorf("dial %s: %w", a, syscall.ECONNREFUSED)
	}
	n.dials[a]++
	n.dialed[a] = append(n.dialed[a], time.Now())
	if h := n.serve[a]; h != nil {
		n.mu.Unlock()
		c, s := net.Pipe()
		go func() { defer s.Close(); vcmp.ServeWholeBatches(s, h) }() //nolint:errcheck // the test reads the client side
		return c, nil
	}
	to, ok := n.at[a]
	gate, wait := n.gate, n.wait
	src := from.addr
	if pub, ok := n.nat[src]; ok {
		src = pub
	}
	dropped, lost := n.drop[a] > 0, n.lose[a] > 0
	if dropped {
		n.drop[a]--
	} else if lost {
		n.lose[a]--
	}
	n.mu.Unlock()
	if dropped {
		return nil, fmt.Errorf("dial %s: connection timed out (dropped by the test)", a)
	}
	if gate != nil {
		wait.Done()
		<-gate
	}
	if !ok {
		return nil, fmt.Errorf("dial %s: no route to host", a)
	}
	c, s := net.Pipe()
	go func() {
		defer s.Close()
		to.e.Serve(s, src) //nolint:errcheck // the test reads the client side
	}()
	if lost {
		return &loseAnswers{Conn: c}, nil
	}
	return c, nil
}

// loseAnswers is a stream whose answers never arrive: what the peer
// sends is read and thrown away, and the reader sees the stream cut.
type loseAnswers struct{ net.Conn }

func (l *loseAnswers) Read(p []byte) (int, error) {
	if _, err := l.Conn.Read(p); err != nil {
		return 0, err
	}
	return 0, io.ErrUnexpectedEOF
}

// move re-addresses nd (its old address leaves the network) without
// restoring anything yet.
func (n *network) move(nd *node, addr string) (old, new netip.Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	old, new = nd.addr, netip.MustParseAddr(addr)
	delete(n.at, old)
	nd.addr = new
	n.at[new] = nd
	return old, new
}

// connect opens a TCP connection between a (client, port cport) and b (port 22).
func connect(a, b *node, cport uint16) (ta, tb vcmp.Tuple) {
	ta = vcmp.Tuple{Proto: vcmp.TCP, Local: netip.AddrPortFrom(a.addr, cport), Remote: netip.AddrPortFrom(b.addr, 22)}
	tb = ta.Reverse()
	a.tr.open = append(a.tr.open, ta)
	b.tr.open = append(b.tr.open, tb)
	return ta, tb
}

func state(t *testing.T, nd *node, v vcmp.Tuple) ConnStatus {
	t.Helper()
	want := v.Local.String() + "->" + v.Remote.String()
	for _, s := range nd.e.Status() {
		if s.Virtual == want && s.Proto == v.Proto.String() {
			return s
		}
	}
	t.Fatalf("%s has no connection %v; it has %+v", nd.name, v, nd.e.Status())
	return ConnStatus{}
}

func wantPhys(t *testing.T, nd *node, v vcmp.Tuple, local, remote netip.Addr) {
	t.Helper()
	p, ok := nd.tr.phys(v)
	if !ok {
		t.Fatalf("%s: %v not translated", nd.name, v)
	}
	want := vcmp.Tuple{Proto: v.Proto, Local: netip.AddrPortFrom(local, v.Local.Port()), Remote: netip.AddrPortFrom(remote, v.Remote.Port())}
	if p != want {
		t.Fatalf("%s: %v translated to %v, want %v", nd.name, v, p, want)
	}
	if s := state(t, nd, v); s.State != "migrated" {
		t.Fatalf("%s: %v is %s, want migrated", nd.name, v, s.State)
	}
}

// keyAll is syncAll, then each daemon's first contact (AgreeKeys, which
// the daemon runs every 2 s): keys are required by default, so an update
// after a move is taken only if it is sealed.
func keyAll(t testing.TB, nds ...*node) {
	t.Helper()
	syncAll(t, nds...)
	for _, nd := range nds {
		if _, err := nd.e.AgreeKeys(t.Context()); err != nil {
			t.Fatalf("%s: first contact: %v", nd.name, err)
		}
	}
}

func syncAll(t testing.TB, nds ...*node) {
	t.Helper()
	for _, nd := range nds {
		if err := nd.e.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

// One end moves (the paper's §4.1): it finds its peer at the peer's own
// place on the first query, and 200 connections with that peer cost one
// locate exchange and one update exchange.
func TestRestoreOneEndMoves(t *testing.T) {
	for _, suspend := range []bool{false, true} {
		t.Run(fmt.Sprintf("suspend=%v", suspend), func(t *testing.T) {
			n := newNetwork()
			a := n.add(t, "a", "10.0.1.1", Config{})
			b := n.add(t, "b", "10.0.2.2", Config{})
			var conns [][2]vcmp.Tuple
			for i := range 200 {
				ta, tb := connect(a, b, uint16(40000+i))
				conns = append(conns, [2]vcmp.Tuple{ta, tb})
			}
			keyAll(t, a, b)
			if suspend {
				k, err := a.e.Suspend(t.Context(), nil)
				if err != nil || k != 200 {
					t.Fatalf("suspend: %d, %v; want 200", k, err)
				}
				if s := state(t, b, conns[0][1]); s.Role != "secondary" || !s.Keyed {
					t.Fatalf("b after a's suspend: %+v, want secondary and keyed", s)
				}
			}
			n.dials = map[netip.Addr]int{}
			old, new := n.move(a, "10.0.3.3")
			if err := a.e.Restore(t.Context(), old, new); err != nil {
				t.Fatal(err)
			}
			for _, c := range conns {
				wantPhys(t, a, c[0], new, b.addr)
				wantPhys(t, b, c[1], b.addr, new)
				if s := state(t, a, c[0]); !s.Keyed {
					t.Fatalf("a: %+v not keyed (first contact or the suspend keys it)", s)
				}
			}
			if got := n.dials[b.addr]; got != 2 {
				t.Errorf("a dialled b %d times for 200 connections, want 2 (one locate batch, one update batch)", got)
			}
			if !slices.Equal(a.tr.kept, []netip.Addr{old}) {
				t.Errorf("a kept %v local, want [%s]", a.tr.kept, old)
			}
			if a.tr.calls != 1 {
				t.Errorf("a installed its translations in %d writes, want 1", a.tr.calls)
			}
			// The peer applies the batch of 200 updates with one write too
			// (it did one per update: most of a large restore's time).
			if b.tr.calls != 1 {
				t.Errorf("b installed 200 updates in %d writes, want 1", b.tr.calls)
			}
			if c := b.e.Counters(); c["updates_applied"] != 200 {
				t.Errorf("b counters %v, want 200 updates applied", c)
			}
		})
	}
}

// Both ends move before either restores (both old places gone): they meet
// at the location server, whichever restores first; keyed if suspended.
func TestRestoreBothEndsMove(t *testing.T) {
	for _, order := range []string{"a first", "b first"} {
		t.Run(order, func(t *testing.T) {
			n := newNetwork()
			loc := netip.MustParseAddr("10.0.9.9")
			n.add(t, "locsrv", loc.String(), Config{})
			a := n.add(t, "a", "10.0.1.1", Config{LocationServers: []netip.Addr{loc}})
			b := n.add(t, "b", "10.0.2.2", Config{LocationServers: []netip.Addr{loc}})
			ta, tb := connect(a, b, 40000)
			syncAll(t, a, b)
			if _, err := a.e.Suspend(t.Context(), nil); err != nil {
				t.Fatal(err)
			}
			if _, err := b.e.Suspend(t.Context(), nil); err != nil { // the secondary moves too (§4.2): nothing sent
				t.Fatal(err)
			}
			aOld, aNew := n.move(a, "10.0.3.3")
			bOld, bNew := n.move(b, "10.0.4.4")
			first, second := a, b
			fo, fn, so, sn := aOld, aNew, bOld, bNew
			if order == "b first" {
				first, second, fo, fn, so, sn = b, a, bOld, bNew, aOld, aNew
			}
			if err := first.e.Restore(t.Context(), fo, fn); err != nil {
				t.Fatal(err)
			}
			var v vcmp.Tuple
			if first == a {
				v = ta
			} else {
				v = tb
			}
			if s := state(t, first, v); s.State != "suspended" {
				t.Fatalf("%s after restoring first: %+v, want suspended (its location stored, waiting)", first.name, s)
			}
			if err := second.e.Restore(t.Context(), so, sn); err != nil {
				t.Fatal(err)
			}
			wantPhys(t, a, ta, aNew, bNew)
			wantPhys(t, b, tb, bNew, aNew)
			if !state(t, a, ta).Keyed || !state(t, b, tb).Keyed {
				t.Errorf("not keyed after a suspend: %+v %+v", state(t, a, ta), state(t, b, tb))
			}
		})
	}
}

// Both ends suspend at once: the claims cross, each end arbitrates alike
// (the higher virtual address is primary), the keys still agree, and the
// migration after both moves is keyed.
func TestCrossingPrimaries(t *testing.T) {
	n := newNetwork()
	loc := netip.MustParseAddr("10.0.9.9")
	n.add(t, "locsrv", loc.String(), Config{})
	a := n.add(t, "a", "10.0.1.1", Config{LocationServers: []netip.Addr{loc}})
	b := n.add(t, "b", "10.0.2.2", Config{LocationServers: []netip.Addr{loc}})
	ta, tb := connect(a, b, 40000)
	syncAll(t, a, b)
	// Both claims are sent before either is answered.
	n.gate, n.wait = make(chan struct{}), &sync.WaitGroup{}
	n.wait.Add(2)
	errs := make(chan error, 2)
	for _, nd := range []*node{a, b} {
		go func() { _, err := nd.e.Suspend(t.Context(), nil); errs <- err }()
	}
	n.wait.Wait()
	n.mu.Lock()
	close(n.gate)
	n.gate = nil
	n.mu.Unlock()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	sa, sb := state(t, a, ta), state(t, b, tb)
	if sa.Role != "secondary" || sb.Role != "primary" || !sa.Keyed || !sb.Keyed {
		t.Fatalf("after crossing claims: a %+v, b %+v; want a secondary, b (higher address) primary, both keyed", sa, sb)
	}
	aOld, aNew := n.move(a, "10.0.3.3")
	bOld, bNew := n.move(b, "10.0.4.4")
	if err := b.e.Restore(t.Context(), bOld, bNew); err != nil {
		t.Fatal(err)
	}
	if err := a.e.Restore(t.Context(), aOld, aNew); err != nil {
		t.Fatal(err)
	}
	wantPhys(t, a, ta, aNew, bNew)
	wantPhys(t, b, tb, bNew, aNew)
	for _, nd := range []*node{a, b} {
		for k, v := range nd.e.Counters() {
			if (strings.HasPrefix(k, "refused") || k == "unexpected") && v > 0 {
				t.Errorf("%s refused something: %v", nd.name, nd.e.Counters())
			}
		}
	}
}

// sendOne sends m to nd as a batch of one and returns the answer.
func sendOne(t *testing.T, n *network, from *node, to netip.Addr, m vcmp.Message) vcmp.Message {
	t.Helper()
	s, err := n.dial(t.Context(), from, to)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ans, err := vcmp.Exchange(s, []vcmp.Message{m})
	if err != nil {
		t.Fatal(err)
	}
	return ans[0]
}

func wantRefused(t *testing.T, what string, m vcmp.Message) {
	t.Helper()
	r, ok := m.(*vcmp.UpdateReply)
	if !ok || r.Status != vcmp.UpdateRefused {
		t.Fatalf("%s: answer %#v, want VNAT_UPD_R refused", what, m)
	}
}

// A forged, a replayed and an unkeyed update are refused, counted and
// logged at most once a second per kind; the connection is left as it was.
// The genuine update (the control) is applied.
func TestForgedReplayedAndUnkeyedUpdatesAreRefused(t *testing.T) {
	n := newNetwork()
	a := n.add(t, "a", "10.0.1.1", Config{})
	clock := time.Unix(1000, 0)
	b := n.add(t, "b", "10.0.2.2", Config{Now: func() time.Time { return clock }})
	mallory := n.add(t, "mallory", "10.0.6.6", Config{})
	ta, tb := connect(a, b, 40000)
	syncAll(t, a, b)
	if _, err := a.e.Suspend(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	keys := *a.e.conns[ta].keys
	evil := netip.AddrPortFrom(mallory.addr, 40000)
	upd := &vcmp.Update{Record: vcmp.Record{Conn: ta, Phys: evil}}

	// Forged: sealed under a key that is not the connection's.
	for i := range 5 {
		forged, err := vcmp.Seal(upd, vcmp.Secret{1, 2, 3}, uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		wantRefused(t, "forged", sendOne(t, n, mallory, b.addr, forged))
	}
	// Unkeyed: plain, on a keyed connection (and b requires keys anyway).
	wantRefused(t, "unkeyed", sendOne(t, n, mallory, b.addr, upd))
	if _, ok := b.tr.phys(tb); ok {
		t.Fatalf("b translated %v after refused updates", tb)
	}
	if s := state(t, b, tb); s.State != "suspended" || s.Role != "secondary" {
		t.Fatalf("b's connection changed after refused updates: %+v", s)
	}

	// The genuine update (the control), from where it says a is, then the
	// same bytes again.
	n.move(a, "10.0.3.3")
	good, err := vcmp.Seal(&vcmp.Update{Record: vcmp.Record{Conn: ta, Phys: netip.MustParseAddrPort("10.0.3.3:40000")}}, keys.Send, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := sendOne(t, n, a, b.addr, good).(*vcmp.Sealed); !ok {
		t.Fatalf("genuine update answered %#v, want a sealed VNAT_UPD_R", r)
	}
	wantPhys(t, b, tb, b.addr, netip.MustParseAddr("10.0.3.3"))
	wantRefused(t, "replayed", sendOne(t, n, mallory, b.addr, good))
	wantPhys(t, b, tb, b.addr, netip.MustParseAddr("10.0.3.3"))

	c := b.e.Counters()
	if c["refused_forged"] != 5 || c["refused_unkeyed"] != 1 || c["refused_replayed"] != 1 || c["updates_applied"] != 1 {
		t.Errorf("b counters %v: want 5 forged, 1 unkeyed, 1 replayed refused, 1 applied", c)
	}
	logs := b.logs.String()
	if k := strings.Count(logs, "err=\"vcmp: update tag does not verify"); k != 1 {
		t.Errorf("5 forged updates within a second logged %d times, want 1:\n%s", k, logs)
	}
	// A second later the next one is logged with the count held back.
	clock = clock.Add(2 * time.Second)
	forged, err := vcmp.Seal(upd, vcmp.Secret{9}, 99)
	if err != nil {
		t.Fatal(err)
	}
	wantRefused(t, "forged later", sendOne(t, n, mallory, b.addr, forged))
	if !strings.Contains(b.logs.String(), "suppressed=4") {
		t.Errorf("the next forged update's log does not say 4 were held back:\n%s", b.logs.String())
	}
}

// By default (no --allow-unkeyed) a move of a connection that was never
// keyed is refused by the peer (the control, keyed by first contact, is
// TestRestoreOneEndMoves/suspend=false).
func TestAnUnkeyedMoveIsRefusedByDefault(t *testing.T) {
	n := newNetwork()
	a := n.add(t, "a", "10.0.1.1", Config{})
	b := n.add(t, "b", "10.0.2.2", Config{})
	ta, tb := connect(a, b, 40000)
	syncAll(t, a, b)
	old, new := n.move(a, "10.0.3.3")
	if err := a.e.Restore(t.Context(), old, new); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.tr.phys(tb); ok {
		t.Fatal("b translated an unkeyed update, keys being required by default")
	}
	if s := state(t, a, ta); s.State != "aborted" {
		t.Fatalf("a's %v after b refused its update: %+v, want aborted", ta, s)
	}
	if c := b.e.Counters(); c["refused_unkeyed"] != 1 {
		t.Errorf("b counters %v, want one unkeyed refusal", c)
	}
}

// A migrated connection that closes is forgotten at the next look, its
// translation removed; the open one beside it stays.
func TestClosedMigratedConnectionIsForgotten(t *testing.T) {
	n := newNetwork()
	a := n.add(t, "a", "10.0.1.1", Config{})
	b := n.add(t, "b", "10.0.2.2", Config{})
	ta, tb := connect(a, b, 40000)
	ta2, _ := connect(a, b, 40001)
	keyAll(t, a, b)
	old, new := n.move(a, "10.0.3.3")
	if err := a.e.Restore(t.Context(), old, new); err != nil {
		t.Fatal(err)
	}
	wantPhys(t, b, tb, b.addr, new)
	a.tr.close(ta)
	b.tr.close(tb)
	syncAll(t, a, b)
	if _, ok := a.tr.phys(ta); ok {
		t.Errorf("a still translates closed %v", ta)
	}
	if _, ok := b.tr.phys(tb); ok {
		t.Errorf("b still translates closed %v", tb)
	}
	if st := a.e.Status(); len(st) != 1 || st[0].Virtual != ta2.Local.String()+"->"+ta2.Remote.String() {
		t.Errorf("a's connections after one closed: %+v, want only %v", st, ta2)
	}
	wantPhys(t, a, ta2, new, b.addr)
}

// Keys agreed at first contact authenticate an unplanned move (no
// suspend), which a peer then accepts (keys are required by default); a key or a
// suspend claim from anyone but the peer is refused and leaves the keys.
func TestFirstContactKeysAndKeysOnlyFromThePeer(t *testing.T) {
	n := newNetwork()
	a := n.add(t, "a", "10.0.1.1", Config{})
	b := n.add(t, "b", "10.0.2.2", Config{})
	mallory := n.add(t, "mallory", "10.0.6.6", Config{})
	ta, tb := connect(a, b, 40000)
	syncAll(t, a, b)
	// Both ends try at once: the agreements cross and still match.
	errs := make(chan error, 2)
	for _, nd := range []*node{a, b} {
		go func() { _, err := nd.e.AgreeKeys(t.Context()); errs <- err }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if !state(t, a, ta).Keyed || !state(t, b, tb).Keyed {
		t.Fatalf("not keyed after first contact: %+v %+v", state(t, a, ta), state(t, b, tb))
	}
	before := *b.e.conns[tb].keys

	var pub [vcmp.KeyLen]byte
	pub[0] = 9
	wantRefused(t, "key from mallory", sendOne(t, n, mallory, b.addr, &vcmp.Key{Record: vcmp.Record{Conn: ta, Phys: netip.AddrPortFrom(mallory.addr, 40000)}, Public: pub}))
	wantRefused(t, "claim from mallory", sendOne(t, n, mallory, b.addr, &vcmp.SuspPrimary{Record: vcmp.Record{Conn: ta, Phys: netip.AddrPortFrom(mallory.addr, 40000)}}))
	if *b.e.conns[tb].keys != before || state(t, b, tb).State != "active" {
		t.Fatalf("b's connection changed after mallory's key and claim: %+v", state(t, b, tb))
	}
	if c := b.e.Counters(); c["refused_key_source"] != 1 || c["refused_claim_source"] != 1 {
		t.Errorf("b counters %v, want one key and one claim refused for their source", c)
	}

	old, new := n.move(a, "10.0.3.3")
	if err := a.e.Restore(t.Context(), old, new); err != nil {
		t.Fatal(err)
	}
	wantPhys(t, a, ta, new, b.addr)
	wantPhys(t, b, tb, b.addr, new)
}

// A suspend and a resume without a move (the move was called off) settle
// the connection again with the peer, and nothing is translated.
func TestSuspendThenResumeWithoutAMove(t *testing.T) {
	n := newNetwork()
	a := n.add(t, "a", "10.0.1.1", Config{})
	b := n.add(t, "b", "10.0.2.2", Config{})
	ta, tb := connect(a, b, 40000)
	syncAll(t, a, b)
	if _, err := a.e.Suspend(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if k, err := a.e.Resume(t.Context()); err != nil || k != 1 {
		t.Fatalf("resume: %d, %v; want 1", k, err)
	}
	for _, c := range []struct {
		nd *node
		v  vcmp.Tuple
	}{{a, ta}, {b, tb}} {
		if s := state(t, c.nd, c.v); s.State != "migrated" || s.Role != "none" {
			t.Errorf("%s after suspend and resume: %+v, want settled (migrated, no role)", c.nd.name, s)
		}
		if p, ok := c.nd.tr.phys(c.v); ok {
			t.Errorf("%s translates %v to %v with nothing moved", c.nd.name, c.v, p)
		}
	}
}

// First contact before the peer's daemon has seen the connection: the peer
// answers unknown, and the next try (after the peer looked) agrees.
func TestFirstContactRetriesAPeerThatHasNotSeenTheConnection(t *testing.T) {
	n := newNetwork()
	a := n.add(t, "a", "10.0.1.1", Config{})
	b := n.add(t, "b", "10.0.2.2", Config{})
	ta, tb := connect(a, b, 40000)
	syncAll(t, a)
	if k, err := a.e.AgreeKeys(t.Context()); err != nil || k != 0 {
		t.Fatalf("first try: %d keyed, %v; want 0 (b does not know it yet)", k, err)
	}
	syncAll(t, b)
	if k, err := a.e.AgreeKeys(t.Context()); err != nil || k != 1 {
		t.Fatalf("second try: %d keyed, %v; want 1", k, err)
	}
	if !state(t, a, ta).Keyed || !state(t, b, tb).Keyed {
		t.Errorf("not keyed: %+v %+v", state(t, a, ta), state(t, b, tb))
	}
}

// Virtual address conflicts (paper §3.4.2, policy abort): an end given its
// peer's virtual address aborts without asking anyone, and an update
// putting the peer at this end's own virtual address is answered conflict
// and changes nothing.
func TestVirtualAddressConflictsAbort(t *testing.T) {
	n := newNetwork()
	a := n.add(t, "a", "10.0.1.1", Config{})
	b := n.add(t, "b", "10.0.2.2", Config{})
	ta, tb := connect(a, b, 40000)
	keyAll(t, a, b)
	old, new := n.move(a, "10.0.3.3")
	if err := a.e.Restore(t.Context(), old, new); err != nil {
		t.Fatal(err)
	}
	wantPhys(t, b, tb, b.addr, new)

	// The peer side: b "moved" to a's virtual address (its update sealed
	// with the connection's keys, as b's daemon would).
	b.e.mu.Lock()
	upd, err := b.e.conns[tb].seal(&vcmp.Update{Record: vcmp.Record{Conn: tb, Phys: netip.MustParseAddrPort("10.0.1.1:22")}})
	b.e.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	bHere, _ := n.move(b, "10.0.1.1") // the update comes from there
	r, ok := sendOne(t, n, b, a.addr, upd).(*vcmp.UpdateReply)
	if !ok || r.Status != vcmp.UpdateConflict {
		t.Fatalf("update to a's own virtual address answered %#v, want conflict", r)
	}
	n.move(b, bHere.String()) // b's daemon never moved
	wantPhys(t, a, ta, new, b.addr)

	// b really is given 10.0.1.1 (a's old, virtual address).
	n.dials = map[netip.Addr]int{}
	bOld, bNew := n.move(b, "10.0.1.1")
	if err := b.e.Restore(t.Context(), bOld, bNew); err != nil {
		t.Fatal(err)
	}
	if s := state(t, b, tb); s.State != "aborted" {
		t.Errorf("b at a's virtual address: %+v, want aborted", s)
	}
	if len(n.dials) != 0 {
		t.Errorf("b asked %v about a connection it cannot carry", n.dials)
	}
	if a.e.Counters()["conflict"] != 1 || b.e.Counters()["conflict"] != 1 {
		t.Errorf("conflict counters: a %v, b %v; want one each", a.e.Counters(), b.e.Counters())
	}
}

// The restore race (found by the Table 1 benchmark): the peer translates
// as soon as it accepts an update and may send at once (a keepalive), so
// the mover must accept packets at its new address BEFORE it sends the
// update, or that packet reaches a new address with no socket for it and
// is reset; and it must not send from the new address before the peer's
// answer, or its packets are reset at the peer. Every translation b
// installs finds a accepting it and not yet sending from there; the
// connection b refuses (b requires keys, and that one was not keyed) is no
// longer accepted at a's new address.
func TestMoverAcceptsAtItsNewAddressBeforeItSendsTheUpdateAndWithdrawsOnRefusal(t *testing.T) {
	n := newNetwork()
	a := n.add(t, "a", "10.0.1.1", Config{})
	b := n.add(t, "b", "10.0.2.2", Config{})
	var conns [][2]vcmp.Tuple
	for i := range 50 {
		ta, tb := connect(a, b, uint16(40000+i))
		conns = append(conns, [2]vcmp.Tuple{ta, tb})
	}
	syncAll(t, a, b)
	// a suspends (and so keys) all but the last connection: b refuses its update.
	refused := conns[len(conns)-1]
	if k, err := a.e.Suspend(t.Context(), func(v vcmp.Tuple) bool { return v != refused[0] }); err != nil || k != len(conns)-1 {
		t.Fatalf("suspend: %d, %v; want %d", k, err, len(conns)-1)
	}

	old, new := n.move(a, "10.0.3.3")
	var mu sync.Mutex
	var early, sending []string
	checked := 0
	b.tr.onTranslate = func(ms []Mapping) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range ms {
			checked++
			va := m.Virtual.Reverse()
			at := vcmp.Tuple{Proto: va.Proto, Local: netip.AddrPortFrom(new, va.Local.Port()), Remote: va.Remote}
			if !a.tr.accepts(va, at) {
				early = append(early, fmt.Sprint(m.Virtual))
			}
			if _, ok := a.tr.phys(va); ok {
				sending = append(sending, fmt.Sprint(m.Virtual))
			}
		}
	}
	if err := a.e.Restore(t.Context(), old, new); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if checked != len(conns)-1 {
		t.Fatalf("b installed %d translations, want %d", checked, len(conns)-1)
	}
	if len(early) > 0 {
		t.Fatalf("b translated %d connections before a accepted them at its new address (a packet from b would be reset there): %v", len(early), early[0])
	}
	if len(sending) > 0 {
		t.Fatalf("a sent from its new address before b translated %d connections (b would reset them): %v", len(sending), sending[0])
	}
	for _, c := range conns[:len(conns)-1] {
		wantPhys(t, a, c[0], new, b.addr)
		wantPhys(t, b, c[1], b.addr, new)
	}
	at := vcmp.Tuple{Proto: refused[0].Proto, Local: netip.AddrPortFrom(new, refused[0].Local.Port()), Remote: refused[0].Remote}
	if a.tr.accepts(refused[0], at) {
		t.Errorf("a still accepts the refused %v at %v, want it withdrawn", refused[0], at)
	}
	if p, ok := a.tr.phys(refused[0]); ok {
		t.Errorf("a translates the refused %v to %v, want untranslated", refused[0], p)
	}
	if s := state(t, a, refused[0]); s.State != "aborted" {
		t.Errorf("a: refused %+v, want aborted", s)
	}
	if c := a.e.Counters(); c["translations_withdrawn"] != 1 || c["migrated"] != uint64(len(conns)-1) {
		t.Errorf("a counters %v, want 1 translation withdrawn and %d migrated", c, len(conns)-1)
	}
}

// Virtual-identification conflicts (paper §3.4.2), per-connection policy:
// b holds a live connection Y from 10.0.3.3:40000 (a new host reused the
// address and port) when a, whose connection X with b came from
// 10.0.1.1:40000, moves to 10.0.3.3 and keeps its port: X at b would
// travel as Y's tuple. Policy abort (the default): X's migration is
// aborted, Y untouched. Policy preempt (set on X at b): X takes the tuple,
// Y is aborted and its translation, if any, forgotten.
func TestVirtualIdentificationConflictAbortOrPreempt(t *testing.T) {
	for _, tc := range []struct {
		policy   Conflict
		closeErr error // the datapath cannot close sockets
	}{{policy: ConflictDefault}, {policy: ConflictAbort}, {policy: ConflictPreempt},
		{policy: ConflictPreempt, closeErr: errors.New("the kernel cannot close sockets (test)")}} {
		policy := tc.policy
		t.Run(fmt.Sprintf("policy=%q,closeErr=%v", policy, tc.closeErr), func(t *testing.T) {
			n := newNetwork()
			a := n.add(t, "a", "10.0.1.1", Config{})
			b := n.add(t, "b", "10.0.2.2", Config{})
			b.tr.closeErr = tc.closeErr
			ta, tb := connect(a, b, 40000)
			y := vcmp.Tuple{Proto: vcmp.TCP, Local: netip.MustParseAddrPort("10.0.2.2:22"), Remote: netip.MustParseAddrPort("10.0.3.3:40000")}
			b.tr.open = append(b.tr.open, y)
			syncAll(t, b)
			keyAll(t, a) // b cannot key Y: its peer is nowhere
			if policy != ConflictDefault {
				if k := b.e.SetConflict(func(v vcmp.Tuple) bool { return v == tb }, policy); k != 1 {
					t.Fatalf("SetConflict set %d connections, want 1", k)
				}
			}
			want := policy
			if want == ConflictDefault {
				want = ConflictAbort
			}
			if s := state(t, b, tb); s.Conflict != string(want) {
				t.Fatalf("b shows X's policy %q, want %q", s.Conflict, want)
			}
			old, new := n.move(a, "10.0.3.3")
			if err := a.e.Restore(t.Context(), old, new); err != nil {
				t.Fatal(err)
			}
			if want == ConflictAbort {
				if s := state(t, a, ta); s.State != "aborted" {
					t.Errorf("a: X %+v, want aborted", s)
				}
				if p, ok := b.tr.phys(tb); ok {
					t.Errorf("b translates X to %v, want untouched", p)
				}
				if s := state(t, b, y); s.State != "active" {
					t.Errorf("b: Y %+v, want active (it keeps its tuple)", s)
				}
				if c := b.e.Counters(); c["conflict"] != 1 || c["preempted"] != 0 {
					t.Errorf("b counters %v, want one conflict, none preempted", c)
				}
				if len(b.tr.socketsClosed) != 0 {
					t.Errorf("b closed sockets %v, want none", b.tr.socketsClosed)
				}
				return
			}
			wantPhys(t, a, ta, new, b.addr)
			wantPhys(t, b, tb, b.addr, new)
			if s := state(t, b, y); s.State != "aborted" {
				t.Errorf("b: Y %+v, want aborted (preempted)", s)
			}
			if c := b.e.Counters(); c["preempted"] != 1 || c["conflict"] != 0 {
				t.Errorf("b counters %v, want one preempted, no conflict abort", c)
			}
			// The preempted connection's socket is closed for real; a
			// datapath that cannot leaves it open and says why.
			if tc.closeErr == nil {
				if !slices.Equal(b.tr.socketsClosed, []vcmp.Tuple{y}) || b.e.Counters()["preempted_closed"] != 1 {
					t.Errorf("b closed sockets %v (counters %v), want Y's (%v) alone", b.tr.socketsClosed, b.e.Counters(), y)
				}
				return
			}
			if c := b.e.Counters(); c["preempt_close_errors"] != 1 || c["preempted_closed"] != 0 {
				t.Errorf("b counters %v, want one preempt_close_errors", c)
			}
			if l := b.logs.String(); !strings.Contains(l, "socket left open") || !strings.Contains(l, tc.closeErr.Error()) {
				t.Errorf("b's log does not say the socket was left open and why:\n%s", l)
			}
		})
	}
}

func TestParseConflictNamesTheBadPolicy(t *testing.T) {
	for _, s := range []string{"abort", "preempt"} {
		if p, err := ParseConflict(s); err != nil || string(p) != s {
			t.Errorf("ParseConflict(%q) = %q, %v", s, p, err)
		}
	}
	for _, s := range []string{"", "Abort", "steal"} {
		if _, err := ParseConflict(s); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", s)) || !strings.Contains(err.Error(), "abort or preempt") {
			t.Errorf("ParseConflict(%q): %v, want an error naming it and the choices", s, err)
		}
	}
}

// The conflict check asks where connections travel now (an index kept on
// every change, issue 20 item 7), not where they started: Z, c's
// connection with b, moved with c to 10.0.3.3:40000 and holds that tuple
// at b, so X (a's, port 40000 too) cannot take it when a comes to
// 10.0.3.3; once c has moved on to 10.0.5.5 the tuple is free and X's
// migration goes through.
func TestConflictSeesWhereConnectionsTravelNow(t *testing.T) {
	for _, cMovesOn := range []bool{false, true} {
		t.Run(fmt.Sprintf("cMovesOn=%v", cMovesOn), func(t *testing.T) {
			n := newNetwork()
			a := n.add(t, "a", "10.0.1.1", Config{})
			b := n.add(t, "b", "10.0.2.2", Config{})
			c := n.add(t, "c", "10.0.4.4", Config{})
			ta, tbx := connect(a, b, 40000)
			tc, tbz := connect(c, b, 40000)
			keyAll(t, a, b, c)
			old, new := n.move(c, "10.0.3.3")
			if err := c.e.Restore(t.Context(), old, new); err != nil {
				t.Fatal(err)
			}
			wantPhys(t, b, tbz, b.addr, new)
			if cMovesOn {
				old, new := n.move(c, "10.0.5.5")
				if err := c.e.Restore(t.Context(), old, new); err != nil {
					t.Fatal(err)
				}
				wantPhys(t, c, tc, new, b.addr)
				wantPhys(t, b, tbz, b.addr, new)
			}
			old, new = n.move(a, "10.0.3.3")
			if err := a.e.Restore(t.Context(), old, new); err != nil {
				t.Fatal(err)
			}
			if cMovesOn {
				wantPhys(t, a, ta, new, b.addr)
				wantPhys(t, b, tbx, b.addr, new)
				if k := b.e.Counters()["conflict"]; k != 0 {
					t.Errorf("b counted %d conflicts, want none (the tuple was free again)", k)
				}
				return
			}
			if s := state(t, a, ta); s.State != "aborted" {
				t.Errorf("a: X %+v, want aborted (Z holds its tuple at b)", s)
			}
			if p, ok := b.tr.phys(tbx); ok {
				t.Errorf("b translates X to %v, want untouched", p)
			}
			wantPhys(t, b, tbz, b.addr, new)
			if k := b.e.Counters()["conflict"]; k != 1 {
				t.Errorf("b counted %d conflicts, want 1", k)
			}
		})
	}
}
