package vnatloc

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/pki/pkitest"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/testenv"
	"github.com/onehop/onehop/internal/vcmp"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newService(t *testing.T) (*Service, *store.Memory, *clock, *bytes.Buffer) {
	t.Helper()
	st := store.NewMemory()
	c := &clock{t: time.Unix(1_000_000, 0)}
	var logs bytes.Buffer
	s := New(st, Config{Now: c.now, Lifetime: 60 * time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err := s.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, st, c, &logs
}

var (
	// web1 moved from 10.1.1.2 to 10.1.2.3; its peer db1 is 10.1.2.2.
	web1Conn = vcmp.Tuple{Proto: vcmp.TCP, Local: netip.MustParseAddrPort("10.1.1.2:40000"), Remote: netip.MustParseAddrPort("10.1.2.2:7100")}
	web1Now  = netip.MustParseAddrPort("10.1.2.3:40000")
	// an external moved from 192.168.100.50 to .60.
	extConn = vcmp.Tuple{Proto: vcmp.UDP, Local: netip.MustParseAddrPort("192.168.100.50:5000"), Remote: netip.MustParseAddrPort("192.168.100.70:53")}
	extNow  = netip.MustParseAddrPort("192.168.100.60:5000")
)

func store1(t *testing.T, s *Service, r vcmp.Record, from string) vcmp.LocStatus {
	t.Helper()
	return s.Handle(context.Background(), &vcmp.LocStore{Record: r}, netip.MustParseAddr(from)).Status
}

// query asks for the peer of conn (the end conn.Remote is sought) and
// returns the status and the location found.
func query(t *testing.T, s *Service, conn vcmp.Tuple, phys netip.AddrPort, storeToo bool) (vcmp.LocStatus, netip.AddrPort) {
	t.Helper()
	a := s.Handle(context.Background(), &vcmp.LocQuery{Record: vcmp.Record{Conn: conn, Phys: phys}, Store: storeToo}, phys.Addr())
	return a.Status, a.Peer
}

// TestLocationRecordExpiresUnlessRefreshed: a record answers for one
// lifetime; the end's refresh keeps it; without one it is gone from the
// answers, from Held and, after a sweep, from the store.
func TestLocationRecordExpiresUnlessRefreshed(t *testing.T) {
	s, st, c, _ := newService(t)
	ctx := context.Background()
	if got := store1(t, s, vcmp.Record{Conn: web1Conn, Phys: web1Now}, "10.1.2.3"); got != vcmp.LocStored {
		t.Fatalf("store: status %d, want stored", got)
	}
	peer := web1Conn.Reverse()
	dbAt := netip.MustParseAddrPort("10.1.2.2:7100")
	held := func() map[netip.Addr]bool {
		t.Helper()
		h, err := Held(ctx, st, c.t)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	c.t = c.t.Add(59 * time.Second)
	if stt, at := query(t, s, peer, dbAt, false); stt != vcmp.LocFound || at != web1Now {
		t.Fatalf("59 s in: %d %v, want found at %v", stt, at, web1Now)
	}
	if !held()[web1Conn.Local.Addr()] {
		t.Fatalf("held %v, want %v in it", held(), web1Conn.Local.Addr())
	}
	// The refresh, from where the record says the end is.
	if got := store1(t, s, vcmp.Record{Conn: web1Conn, Phys: web1Now}, "10.1.2.3"); got != vcmp.LocStored {
		t.Fatalf("refresh: status %d, want stored", got)
	}
	c.t = c.t.Add(59 * time.Second)
	if stt, _ := query(t, s, peer, dbAt, false); stt != vcmp.LocFound {
		t.Fatalf("59 s after the refresh: status %d, want found", stt)
	}
	c.t = c.t.Add(time.Second)
	if stt, _ := query(t, s, peer, dbAt, false); stt != vcmp.LocNotFound {
		t.Fatalf("a lifetime after the refresh: status %d, want not found", stt)
	}
	if len(held()) != 0 {
		t.Fatalf("held %v after expiry, want none", held())
	}
	if kvs, _, _ := st.List(ctx, Prefix); len(kvs) != 0 {
		t.Fatalf("store still has %v", kvs)
	}
	// A record nobody asks for is swept.
	if got := store1(t, s, vcmp.Record{Conn: extConn, Phys: extNow}, "192.168.100.60"); got != vcmp.LocStored {
		t.Fatalf("store: %d", got)
	}
	c.t = c.t.Add(61 * time.Second)
	if n, err := s.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("sweep: %d %v, want 1", n, err)
	}
	if kvs, _, _ := st.List(ctx, Prefix); len(kvs) != 0 {
		t.Fatalf("store after the sweep: %v", kvs)
	}
	if got := s.Counters()["expired"]; got != 2 {
		t.Fatalf("expired counter %d, want 2", got)
	}
}

// TestThirdPartyCannotOverwriteOrReleaseALocation: once web1 stored where
// it is, a third party can neither store web1's connection elsewhere (from
// its own address or naming another), nor withdraw it; the record still
// points at web1 and the refusals are counted. After the record expires a
// new writer may take it (first writer wins until expiry), and the owner
// may release its own at once.
func TestThirdPartyCannotOverwriteOrReleaseALocation(t *testing.T) {
	s, _, c, logs := newService(t)
	rec := vcmp.Record{Conn: web1Conn, Phys: web1Now}
	if got := store1(t, s, rec, "10.1.2.3"); got != vcmp.LocStored {
		t.Fatalf("owner's store: %d", got)
	}
	thief := netip.MustParseAddrPort("10.1.3.9:40000") // a VM of the same farm
	for _, tc := range []struct {
		name   string
		msg    vcmp.Message
		from   string
		reason string
	}{
		{"store at the thief's own address", &vcmp.LocStore{Record: vcmp.Record{Conn: web1Conn, Phys: thief}}, "10.1.3.9", "owner"},
		{"query-and-store at the thief's address", &vcmp.LocQuery{Record: vcmp.Record{Conn: web1Conn, Phys: thief}, Store: true}, "10.1.3.9", "owner"},
		{"store naming another address than the source", &vcmp.LocStore{Record: vcmp.Record{Conn: web1Conn, Phys: netip.MustParseAddrPort("10.1.4.4:40000")}}, "10.1.3.9", "source"},
		{"release from elsewhere", vcmp.Release(web1Conn), "10.1.3.9", "owner"},
		{"store from the fabric", &vcmp.LocStore{Record: vcmp.Record{Conn: web1Conn, Phys: netip.MustParseAddrPort("192.168.100.66:1")}}, "192.168.100.66", "space"},
		{"store from another farm", &vcmp.LocStore{Record: vcmp.Record{Conn: web1Conn, Phys: netip.MustParseAddrPort("10.2.1.2:1")}}, "10.2.1.2", "space"},
	} {
		before := s.Counters()["refused_"+tc.reason]
		a := s.Handle(context.Background(), tc.msg, netip.MustParseAddr(tc.from))
		if a.Status != vcmp.LocRefused {
			t.Errorf("%s: status %d, want refused", tc.name, a.Status)
		}
		if got := s.Counters()["refused_"+tc.reason]; got != before+1 {
			t.Errorf("%s: refused_%s %d, want %d", tc.name, tc.reason, got, before+1)
		}
		if stt, at := query(t, s, web1Conn.Reverse(), netip.MustParseAddrPort("10.1.2.2:7100"), false); stt != vcmp.LocFound || at != web1Now {
			t.Fatalf("after %s: %d %v, want found at web1's %v", tc.name, stt, at, web1Now)
		}
	}
	// One log line per reason within a second, not one per refusal.
	if n := strings.Count(logs.String(), "reason=owner"); n != 1 {
		t.Errorf("%d log lines for 3 owner refusals within a second, want 1:\n%s", n, logs)
	}
	// Expired, the record is anyone's (who stores where they are).
	c.t = c.t.Add(61 * time.Second)
	if got := store1(t, s, vcmp.Record{Conn: web1Conn, Phys: thief}, "10.1.3.9"); got != vcmp.LocStored {
		t.Fatalf("store after expiry: %d, want stored", got)
	}
	// The owner releases its own record at once.
	if a := s.Handle(context.Background(), vcmp.Release(web1Conn), netip.MustParseAddr("10.1.3.9")); a.Status != vcmp.LocNotFound {
		t.Fatalf("owner's release: status %d, want not found", a.Status)
	}
	if stt, _ := query(t, s, web1Conn.Reverse(), netip.MustParseAddrPort("10.1.2.2:7100"), false); stt != vcmp.LocNotFound {
		t.Fatalf("after the release: status %d, want not found", stt)
	}
}

// TestMalformedLocationMessagesAreRefused: every field is checked; each bad
// record is refused and counted, nothing is stored.
func TestMalformedLocationMessagesAreRefused(t *testing.T) {
	s, st, _, _ := newService(t)
	ap := netip.MustParseAddrPort
	good := vcmp.Record{Conn: extConn, Phys: extNow}
	for _, tc := range []struct {
		name string
		mod  func(r *vcmp.Record)
	}{
		{"zero local port", func(r *vcmp.Record) { r.Conn.Local = ap("192.168.100.50:0") }},
		{"zero remote port", func(r *vcmp.Record) { r.Conn.Remote = ap("192.168.100.70:0") }},
		{"loopback local", func(r *vcmp.Record) { r.Conn.Local = ap("127.0.0.1:5000") }},
		{"multicast remote", func(r *vcmp.Record) { r.Conn.Remote = ap("224.0.0.5:53") }},
		{"broadcast remote", func(r *vcmp.Record) { r.Conn.Remote = ap("255.255.255.255:53") }},
		{"unspecified local", func(r *vcmp.Record) { r.Conn.Local = ap("0.0.0.0:5000") }},
		{"link-local local", func(r *vcmp.Record) { r.Conn.Local = ap("169.254.1.1:5000") }},
		{"local is remote", func(r *vcmp.Record) { r.Conn.Remote = r.Conn.Local }},
		{"zero phys port", func(r *vcmp.Record) { r.Phys = ap("192.168.100.60:0") }},
	} {
		r := good
		tc.mod(&r)
		before := s.Counters()["refused_invalid"]
		if got := store1(t, s, r, "192.168.100.60"); got != vcmp.LocRefused {
			t.Errorf("%s: status %d, want refused", tc.name, got)
		}
		if got := s.Counters()["refused_invalid"]; got != before+1 {
			t.Errorf("%s: refused_invalid %d, want %d", tc.name, got, before+1)
		}
	}
	// A message that is no location message is refused, not dropped: the
	// batch's answers stay in line.
	if a := s.Handle(context.Background(), &vcmp.Update{Record: good}, extNow.Addr()); a.Status != vcmp.LocRefused {
		t.Errorf("VNAT_UPD: status %d, want refused", a.Status)
	}
	if kvs, _, _ := st.List(context.Background(), Prefix); len(kvs) != 0 {
		t.Fatalf("stored %v from malformed messages", kvs)
	}
	if got := store1(t, s, good, "192.168.100.60"); got != vcmp.LocStored {
		t.Fatalf("the well-formed record (control): %d, want stored", got)
	}
}

// TestASourceHoldsABoundedNumberOfAddresses: one source cannot take more
// than MaxHeldPerSource virtual addresses from the allocator.
func TestASourceHoldsABoundedNumberOfAddresses(t *testing.T) {
	s, st, c, _ := newService(t)
	s.cfg.MaxHeldPerSource = 3
	from := "10.1.2.3"
	for i := range 5 {
		conn := web1Conn
		conn.Local = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, 1, byte(10 + i)}), 40000)
		got := store1(t, s, vcmp.Record{Conn: conn, Phys: web1Now}, from)
		if want := vcmp.LocStored; i >= 3 {
			if got != vcmp.LocRefused {
				t.Errorf("address %d: status %d, want refused", i, got)
			}
		} else if got != want {
			t.Errorf("address %d: status %d, want stored", i, got)
		}
	}
	h, err := Held(context.Background(), st, c.t)
	// Three virtual addresses, and where the source is.
	if err != nil || len(h) != 4 || !h[web1Now.Addr()] {
		t.Fatalf("held %v %v, want 3 virtual addresses and %v", HeldList(h), err, web1Now.Addr())
	}
	// More connections of an address already held are fine.
	conn := web1Conn
	conn.Local = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, 1, 10}), 40001)
	if got := store1(t, s, vcmp.Record{Conn: conn, Phys: netip.AddrPortFrom(web1Now.Addr(), 40001)}, from); got != vcmp.LocStored {
		t.Fatalf("second connection of a held address: %d, want stored", got)
	}
}

// TestRecordsOutliveAServerRestart: a new service over the same store
// answers from the records, and still refuses the third party.
func TestRecordsOutliveAServerRestart(t *testing.T) {
	s, st, c, _ := newService(t)
	if got := store1(t, s, vcmp.Record{Conn: web1Conn, Phys: web1Now}, "10.1.2.3"); got != vcmp.LocStored {
		t.Fatal(got)
	}
	s2 := New(st, Config{Now: c.now, Lifetime: 60 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err := s2.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if stt, at := query(t, s2, web1Conn.Reverse(), netip.MustParseAddrPort("10.1.2.2:7100"), false); stt != vcmp.LocFound || at != web1Now {
		t.Fatalf("after a restart: %d %v", stt, at)
	}
	if got := store1(t, s2, vcmp.Record{Conn: web1Conn, Phys: netip.MustParseAddrPort("10.1.3.9:1")}, "10.1.3.9"); got != vcmp.LocRefused {
		t.Fatalf("overwrite after a restart: %d, want refused", got)
	}
}

// TestServeStreamAnswersABatchAndClosesOnGarbage: the server side of a
// stream, as a daemon's locate walk uses it (query-and-store in a batch),
// and a garbage message counted and ending the stream.
func TestServeStreamAnswersABatchAndClosesOnGarbage(t *testing.T) {
	s, _, _, _ := newService(t)
	a, b := net.Pipe()
	done := make(chan struct{})
	go func() { s.ServeStream(context.Background(), b, web1Now.Addr()); b.Close(); close(done) }()
	ans, err := vcmp.Exchange(a, []vcmp.Message{vcmp.Query(vcmp.Record{Conn: web1Conn, Phys: web1Now}), vcmp.Query(vcmp.Record{Conn: web1Conn, Phys: web1Now})})
	if err != nil {
		t.Fatal(err)
	}
	if st := ans[0].(*vcmp.LocAnswer).Status; st != vcmp.LocStored {
		t.Fatalf("first: %d, want stored", st)
	}
	if st := ans[1].(*vcmp.LocAnswer).Status; st != vcmp.LocStored {
		t.Fatalf("second (a refresh): %d, want stored", st)
	}
	if _, err := a.Write([]byte{1, 99, 0, 4}); err != nil { // command 99
		t.Fatal(err)
	}
	<-done
	a.Close()
	if got := s.Counters()["bad_messages"]; got != 1 {
		t.Fatalf("bad_messages %d, want 1", got)
	}
}

// TestARelayIsTakenOnlyOnTheAgentsChannelFromTheVMsHost: a stream that
// starts with VCMP_RELAY is served as coming from the VM it names only on
// the agents' channel, TLS with a client certificate of the cluster's CA
// whose CN is the VM's host (RelayAllowed, the controller's intent); the
// relayed VM still stores only where it is. The control first: h1's agent
// stores web1's record. Then what a sliver on h1 can do (it shares h1's
// address, not its key): a plain relay from the host's address releasing
// web1's record, h2's agent speaking for h1's VM, another CA's certificate
// naming h1, and h1's channel without a VCMP_RELAY are each closed
// unanswered and counted (refused_relay), and web1's record stays.
func TestARelayIsTakenOnlyOnTheAgentsChannelFromTheVMsHost(t *testing.T) {
	s, _, _, logs := newService(t)
	p := pkitest.New(t)
	s.cfg.RelayTLS = p.ServerConfig()
	s.cfg.RelayAllowed = func(_ context.Context, node string, source netip.Addr) (bool, error) {
		return node == "h1" && source == web1Now.Addr(), nil
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(t.Context(), l) //nolint:errcheck // ends with the test
	// relay opens a stream (over TLS with cfg, plain if nil), names source
	// in a VCMP_RELAY unless source is invalid, and exchanges msgs.
	relay := func(cfg *tls.Config, source netip.Addr, msgs ...vcmp.Message) ([]vcmp.Message, error) {
		c, err := net.Dial("tcp4", l.Addr().String())
		if err != nil {
			return nil, err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
		if cfg != nil {
			c = tls.Client(c, cfg)
		}
		if source.IsValid() {
			if err := vcmp.WriteMessage(c, &vcmp.Relay{Source: source}); err != nil {
				return nil, err
			}
		}
		return vcmp.Exchange(c, msgs)
	}
	own := &vcmp.LocStore{Record: vcmp.Record{Conn: web1Conn, Phys: web1Now}}
	elsewhere := &vcmp.LocStore{Record: vcmp.Record{Conn: web1Conn, Phys: netip.MustParseAddrPort("10.1.2.77:40000")}}
	ans, err := relay(p.Agent("h1"), web1Now.Addr(), own, elsewhere)
	if err != nil {
		t.Fatalf("web1's store through h1's agent: %v", err)
	}
	if st := ans[0].(*vcmp.LocAnswer).Status; st != vcmp.LocStored {
		t.Fatalf("web1's own record through its host: %d, want stored", st)
	}
	if st := ans[1].(*vcmp.LocAnswer).Status; st != vcmp.LocRefused {
		t.Fatalf("a record at another address through the relay: %d, want refused", st)
	}
	if c := s.Counters(); c["relayed_streams"] != 1 || c["stored"] != 1 || c["refused_relay"] != 0 {
		t.Fatalf("after the control: %v, want relayed_streams 1, stored 1, refused_relay 0", c)
	}

	attacks := []struct {
		name   string
		cfg    *tls.Config
		source netip.Addr
	}{
		{"a plain stream from the host's address", nil, web1Now.Addr()},
		{"h2's agent for h1's VM", p.Agent("h2"), web1Now.Addr()},
		{"another CA's certificate naming h1", p.Stranger("h1"), web1Now.Addr()},
		{"h1's channel without a VCMP_RELAY", p.Agent("h1"), netip.Addr{}},
	}
	for i, a := range attacks {
		if _, err := relay(a.cfg, a.source, vcmp.Release(web1Conn)); err == nil {
			t.Fatalf("%s: the release was answered", a.name)
		}
		testenv.Eventually(t, a.name+" counted", 10*time.Second, func() bool { return s.Counters()["refused_relay"] == uint64(i+1) })
		if st, at := query(t, s, web1Conn.Reverse(), netip.MustParseAddrPort("10.1.2.2:7100"), false); st != vcmp.LocFound || at != web1Now {
			t.Fatalf("after %s: web1's record %d %v, want found at %v", a.name, st, at, web1Now)
		}
	}
	if c := s.Counters(); c["released"] != 0 || c["relayed_streams"] != 1 {
		t.Fatalf("counters %v: something was relayed or released", c)
	}
	if n := strings.Count(logs.String(), "relay refused"); n < 1 || n > len(attacks) {
		t.Fatalf("%d log lines of refused relays, want 1 to %d (rate-limited)", n, len(attacks))
	}
}

// TestOnlyTheAddressHolderClaimsIt: a VM stores a record claiming a
// virtual address away from where it is only if the address is its, as
// intent (Holder) and the records say. The control: web1 claims the
// address it had before its move (10.1.1.2) and is stored. Then a thief in
// the same farm claims db2's live address, an address nobody ever held,
// and web1's: each refused and counted (refused_holder), none held. A VM
// that moved twice still claims its first address, and once intent has
// forgotten it, its live records say it is its.
func TestOnlyTheAddressHolderClaimsIt(t *testing.T) {
	s, _, c, _ := newService(t)
	who := map[string]string{"10.1.2.3": "vm:blue/web1", "10.1.4.4": "vm:blue/web1", "10.1.3.9": "vm:blue/thief"}
	s.cfg.Identity = func(_ context.Context, a netip.Addr) (string, error) { return who[a.String()], nil }
	holders := map[string]Holders{"10.1.1.2": {Before: []string{"vm:blue/web1"}}, "10.1.1.5": {Now: "vm:blue/db2"}}
	s.cfg.Holder = func(_ context.Context, a netip.Addr) (Holders, error) { return holders[a.String()], nil }
	if got := store1(t, s, vcmp.Record{Conn: web1Conn, Phys: web1Now}, "10.1.2.3"); got != vcmp.LocStored {
		t.Fatalf("web1 claiming its former address: %d, want stored", got)
	}
	if got := s.Counters()["stored"]; got != 1 {
		t.Fatalf("stored %d, want 1", got)
	}
	thief := netip.MustParseAddrPort("10.1.3.9:40000")
	for i, local := range []string{"10.1.1.5:40000", "10.1.1.9:40000", "10.1.1.2:41000"} {
		conn := vcmp.Tuple{Proto: vcmp.TCP, Local: netip.MustParseAddrPort(local), Remote: netip.MustParseAddrPort("10.1.2.2:7100")}
		if got := store1(t, s, vcmp.Record{Conn: conn, Phys: thief}, "10.1.3.9"); got != vcmp.LocRefused {
			t.Fatalf("the thief claiming %s: %d, want refused", local, got)
		}
		if got := s.Counters()["refused_holder"]; got != uint64(i+1) {
			t.Fatalf("refused_holder %d after the thief claimed %s, want %d", got, local, i+1)
		}
	}
	held, err := Held(context.Background(), s.store, c.t)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"10.1.1.5", "10.1.1.9", "10.1.3.9"} {
		if held[netip.MustParseAddr(a)] {
			t.Fatalf("%s held after the thief's claims: %s", a, HeldList(held))
		}
	}
	// web1 moves again: its former address is still its.
	next := netip.MustParseAddrPort("10.1.4.4:40000")
	if got := store1(t, s, vcmp.Record{Conn: web1Conn, Phys: next}, "10.1.4.4"); got != vcmp.LocStored {
		t.Fatalf("web1 from its next address: %d, want stored", got)
	}
	// Intent no longer lists it (a VM keeps intent.MaxFormer): web1's live
	// record says it, for its other connections too; the thief still not.
	delete(holders, "10.1.1.2")
	other := vcmp.Tuple{Proto: vcmp.TCP, Local: netip.MustParseAddrPort("10.1.1.2:40001"), Remote: netip.MustParseAddrPort("10.1.2.2:7100")}
	if got := store1(t, s, vcmp.Record{Conn: other, Phys: netip.MustParseAddrPort("10.1.4.4:40001")}, "10.1.4.4"); got != vcmp.LocStored {
		t.Fatalf("web1's other connection from 10.1.1.2, by its records: %d, want stored", got)
	}
	if got := store1(t, s, vcmp.Record{Conn: vcmp.Tuple{Proto: vcmp.TCP, Local: netip.MustParseAddrPort("10.1.1.2:42000"), Remote: other.Remote}, Phys: thief}, "10.1.3.9"); got != vcmp.LocRefused {
		t.Fatalf("the thief claiming web1's former address by records: %d, want refused", got)
	}
}

// TestAVMOwnsItsRecordsAcrossMoves: with the controller's Identity (a VM by
// farm and name), a VM that moves again refreshes its record from its next
// address at once, while another VM still cannot touch it.
func TestAVMOwnsItsRecordsAcrossMoves(t *testing.T) {
	s, _, _, _ := newService(t)
	who := map[string]string{"10.1.2.3": "vm:blue/web1", "10.1.4.4": "vm:blue/web1", "10.1.3.9": "vm:blue/thief"}
	s.cfg.Identity = func(_ context.Context, a netip.Addr) (string, error) { return who[a.String()], nil }
	if got := store1(t, s, vcmp.Record{Conn: web1Conn, Phys: web1Now}, "10.1.2.3"); got != vcmp.LocStored {
		t.Fatal(got)
	}
	next := netip.MustParseAddrPort("10.1.4.4:40000")
	if got := store1(t, s, vcmp.Record{Conn: web1Conn, Phys: next}, "10.1.4.4"); got != vcmp.LocStored {
		t.Fatalf("web1 from its next address: %d, want stored", got)
	}
	if got := store1(t, s, vcmp.Record{Conn: web1Conn, Phys: netip.MustParseAddrPort("10.1.3.9:40000")}, "10.1.3.9"); got != vcmp.LocRefused {
		t.Fatalf("another VM: %d, want refused", got)
	}
	if stt, at := query(t, s, web1Conn.Reverse(), netip.MustParseAddrPort("10.1.2.2:7100"), false); stt != vcmp.LocFound || at != next {
		t.Fatalf("%d %v, want found at %v", stt, at, next)
	}
}
