package controller

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lisp"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/testenv"
)

var dcSite = lisp.Site{Name: "dc", KeyID: 1, Key: []byte("dc-site-secret"), EIDs: []netip.Prefix{netip.MustParsePrefix("10.99.0.0/16")}}

// fakeClock is a time the test moves.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }
func newClock() *fakeClock                   { c := &fakeClock{}; c.ns.Store(time.Now().UnixNano()); return c }
func rec(eid string, rlocs ...string) lisp.Record {
	r := lisp.Record{EID: netip.MustParsePrefix(eid), TTL: 10 * time.Minute}
	for _, a := range rlocs {
		r.Locators = append(r.Locators, lisp.Locator{Addr: netip.MustParseAddr(a), Priority: 1, Weight: 50, Reachable: true})
	}
	return r
}

// lispServer starts a map-server on loopback for a controller on a memory
// store.
func lispServer(t *testing.T, clock *fakeClock, sites ...lisp.Site) (*Controller, *store.Memory, *LISPServer, *testenv.Buffer) {
	t.Helper()
	cfg := LISPServerConfig{Sites: sites}
	if clock != nil {
		cfg.Now = clock.Now
	}
	return lispServerWith(t, cfg)
}

// lispServerWith is lispServer with the configuration's other fields.
func lispServerWith(t *testing.T, cfg LISPServerConfig) (*Controller, *store.Memory, *LISPServer, *testenv.Buffer) {
	t.Helper()
	s := store.NewMemory()
	logs := &testenv.Buffer{}
	c := New(s, slog.New(slog.NewTextHandler(logs, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	cfg.Listen, cfg.Sweep = "127.0.0.1:0", 20*time.Millisecond
	srv, err := c.ServeLISP(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); <-srv.Done() })
	return c, s, srv, logs
}

func sendRaw(t *testing.T, to netip.AddrPort, b []byte) {
	t.Helper()
	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write(b); err != nil {
		t.Fatal(err)
	}
}

func TestLISPMapServerAnswersFromOperatorMappingsAndNegativeForTheRest(t *testing.T) {
	c, _, srv, _ := lispServer(t, nil)
	ttl := int64(30)
	if _, err := c.AddLISPMapping(t.Context(), LISPMappingBody{EID: "10.99.0.0/16", TTLMinutes: &ttl, Locators: []LISPLocatorBody{
		{Addr: "192.168.100.11"}, {Addr: "192.168.100.12", Priority: ptr(255)}}}); err != nil {
		t.Fatal(err)
	}
	r := lisp.NewResolver(srv.Addr())
	got, err := r.Resolve(t.Context(), netip.MustParseAddr("10.99.7.7"))
	if err != nil {
		t.Fatal(err)
	}
	if got.EID.String() != "10.99.0.0/16" || got.TTL != 30*time.Minute || len(got.Locators) != 2 || !got.Authoritative ||
		len(got.Usable()) != 1 || got.Usable()[0].Addr.String() != "192.168.100.11" {
		t.Fatalf("answer %+v", got)
	}
	// The same through an ECM, as RFC 9301 ITRs send it.
	re := lisp.NewResolver(srv.Addr())
	re.ECM = true
	if viaECM, err := re.Resolve(t.Context(), netip.MustParseAddr("10.99.7.8")); err != nil || viaECM.EID != got.EID || len(viaECM.Locators) != 2 {
		t.Fatalf("through an ECM: %+v, %v", viaECM, err)
	}
	neg, err := r.Resolve(t.Context(), netip.MustParseAddr("8.8.8.8"))
	if err != nil {
		t.Fatal(err)
	}
	if !neg.Negative() || neg.Action != lisp.ActionNativelyForward || neg.TTL != lisp.NegativeTTL || neg.EID.Contains(netip.MustParseAddr("10.99.0.1")) {
		t.Fatalf("negative answer %+v", neg)
	}
	// A mapping deleted through the API is no longer answered.
	if err := c.DeleteLISPMapping(t.Context(), netip.MustParsePrefix("10.99.0.0/16")); err != nil {
		t.Fatal(err)
	}
	r.Flush()
	gone, err := r.Resolve(t.Context(), netip.MustParseAddr("10.99.7.7"))
	if err != nil || !gone.Negative() {
		t.Fatalf("after delete: %+v, %v; want negative", gone, err)
	}
	// The server counts a reply once it has sent it, so the client can hold
	// the last reply before the count moves: await it.
	testenv.Eventually(t, "4 requests answered, 2 negatively", 5*time.Second, func() bool {
		st := c.LISPServerStats()
		return st.Requests == 4 && st.NegativeReplies == 2
	})
	// An ECM must carry a Map-Request; one carrying anything else, and a
	// type this map-server does not take, are refused and counted.
	reg, err := (&lisp.MapRegister{Nonce: 1, Records: []lisp.Record{rec("10.99.0.0/16", "192.168.100.11")}}).Encode()
	if err != nil {
		t.Fatal(err)
	}
	wrapped, err := (&lisp.ECM{Source: netip.MustParseAddrPort("127.0.0.1:1"), Dest: netip.MustParseAddrPort("10.99.0.1:4342"), Message: reg}).Encode()
	if err != nil {
		t.Fatal(err)
	}
	sendRaw(t, srv.Addr(), wrapped)
	sendRaw(t, srv.Addr(), []byte{0x70, 0, 0, 0})
	testenv.Eventually(t, "2 refused datagrams", 5*time.Second, func() bool { return c.LISPServerStats().RequestsRefused == 2 })
}

func ptr(v int) *int { return &v }

// udpOn is a UDP socket on ip (any port), closed with the test.
func udpOn(t *testing.T, ip string) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(ip), 0)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// nextReply reads the next Map-Reply on c; ok false when none comes within
// wait.
func nextReply(t *testing.T, c *net.UDPConn, wait time.Duration) (rep lisp.MapReply, size int, ok bool) {
	t.Helper()
	buf := make([]byte, lisp.MaxMessageLen+1)
	c.SetReadDeadline(time.Now().Add(wait))
	n, err := c.Read(buf)
	if err != nil {
		return rep, 0, false
	}
	rep, err = lisp.DecodeMapReply(buf[:n])
	if err != nil {
		t.Fatalf("a datagram on %s that is no Map-Reply: %v", c.LocalAddr(), err)
	}
	return rep, n, true
}

// The attack run's reflection: an ECM Map-Request of 100 records naming a
// victim as ITR-RLOC drew 4 KB replies at the victim, as fast as it was
// sent. Replies larger than the request now go back to its sender, and
// each source, and all together, are rate-limited (a clock that does not
// move, so the buckets never refill during the test).
func TestLISPMapResolverNeverAmplifiesAtAThirdAddressAndRateLimitsRequests(t *testing.T) {
	clock := newClock()
	c, _, srv, _ := lispServerWith(t, LISPServerConfig{Now: clock.Now, RequestRate: 1, RequestBurst: 5, TotalRate: 1, TotalBurst: 8})
	if _, err := c.AddLISPMapping(t.Context(), LISPMappingBody{EID: "10.99.0.0/16", Locators: []LISPLocatorBody{
		{Addr: "192.168.100.11"}, {Addr: "192.168.100.12"}}}); err != nil {
		t.Fatal(err)
	}
	attacker, victim := udpOn(t, "127.0.0.1"), udpOn(t, "127.0.0.2")
	victimAt := victim.LocalAddr().(*net.UDPAddr).AddrPort()
	ecm := func(nonce uint64, eids int) []byte {
		t.Helper()
		req := lisp.MapRequest{Nonce: nonce, ITRRLOCs: []netip.Addr{victimAt.Addr()}}
		for i := range eids {
			req.EIDs = append(req.EIDs, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 99, byte(i), 1}), 32))
		}
		m, err := req.Encode()
		if err != nil {
			t.Fatal(err)
		}
		b, err := (&lisp.ECM{Source: victimAt, Dest: netip.MustParseAddrPort("10.99.0.1:4342"), Message: m}).Encode()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	send := func(from *net.UDPConn, b []byte) {
		t.Helper()
		if _, err := from.WriteToUDPAddrPort(b, srv.Addr()); err != nil {
			t.Fatal(err)
		}
	}

	// Control: an ITR's own ECM Map-Request is answered at its ITR-RLOC.
	r := lisp.NewResolver(srv.Addr())
	r.ECM = true
	if got, err := r.Resolve(t.Context(), netip.MustParseAddr("10.99.7.7")); err != nil || len(got.Locators) != 2 {
		t.Fatalf("control: %+v, %v", got, err)
	}
	testenv.Eventually(t, "the control counted", 5*time.Second, func() bool { return c.LISPServerStats().Requests == 1 })

	// The attack: 100 records, the victim as ITR-RLOC, then a one-record
	// request naming the victim whose reply is smaller than it (allowed:
	// no amplification), which marks the victim's socket as live and
	// would arrive after the big one.
	big := ecm(0xb16, 100)
	send(attacker, big)
	small := ecm(0x5a11, 1)
	send(attacker, small)
	rep, n, ok := nextReply(t, victim, 5*time.Second)
	if !ok || rep.Nonce != 0x5a11 {
		t.Fatalf("the victim's first datagram: nonce %#x, %d bytes (ok %v); want the small reply (%#x), the %d-byte request's reply never", rep.Nonce, n, ok, 0x5a11, len(big))
	}
	if n > len(small) {
		t.Fatalf("the reply sent to the victim has %d bytes, more than the %d-byte request", n, len(small))
	}
	rep, n, ok = nextReply(t, attacker, 5*time.Second)
	if !ok || rep.Nonce != 0xb16 || len(rep.Records) != 100 || n <= len(big) {
		t.Fatalf("the sender got nonce %#x, %d records, %d bytes (ok %v); want the 100-record reply, larger than its %d-byte request", rep.Nonce, len(rep.Records), n, ok, len(big))
	}
	t.Logf("a %d-byte request with 100 records: its %d-byte reply went back to its sender", len(big), n)
	if st := c.LISPServerStats(); st.RepliesToSource != 1 || st.Requests != 3 {
		t.Fatalf("stats %+v: want 3 answered, 1 sent to its source", st)
	}

	// A flood from one source: 127.0.0.1 has 2 of its 5 tokens left.
	bare, err := (&lisp.MapRequest{Nonce: 7, ITRRLOCs: []netip.Addr{netip.MustParseAddr("127.0.0.1")},
		EIDs: []netip.Prefix{netip.MustParsePrefix("10.99.1.1/32")}}).Encode()
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		send(attacker, bare)
	}
	testenv.Eventually(t, "the flood read", 5*time.Second, func() bool {
		st := c.LISPServerStats()
		return st.Requests+st.RequestsRateLimited == 3+20
	})
	if st := c.LISPServerStats(); st.Requests != 5 || st.RequestsRateLimited != 18 {
		t.Fatalf("a flood of 20 from a source with 2 tokens: %d answered, %d rate-limited; want 2 and 18", st.Requests-3, st.RequestsRateLimited)
	}
	// The two answers may be slow to come on a loaded machine; a third
	// is looked for only after both have come.
	for i := range 2 {
		if _, _, ok := nextReply(t, attacker, 5*time.Second); !ok {
			t.Fatalf("the flooding source got %d replies, want 2", i)
		}
	}
	if rep, _, ok := nextReply(t, attacker, 300*time.Millisecond); ok {
		t.Fatalf("the flooding source got a third reply (nonce %#x), want 2", rep.Nonce)
	}
	// Another source is answered: its own bucket, and the total (8) has 3
	// left; then the total runs out for everyone.
	other := udpOn(t, "127.0.0.3")
	for range 5 {
		send(other, bare)
	}
	testenv.Eventually(t, "the other source read", 5*time.Second, func() bool {
		st := c.LISPServerStats()
		return st.Requests+st.RequestsRateLimited == 3+20+5
	})
	if st := c.LISPServerStats(); st.Requests != 8 || st.RequestsRateLimited != 20 {
		t.Fatalf("5 from another source: %d answered, %d rate-limited in all; want 3 more answered (the total's rest), 2 more limited", st.Requests, st.RequestsRateLimited)
	}
	// Time refills the buckets.
	clock.Advance(10 * time.Second)
	if got, err := lisp.NewResolver(srv.Addr()).Resolve(t.Context(), netip.MustParseAddr("10.99.2.2")); err != nil || got.Negative() {
		t.Fatalf("after 10 s: %+v, %v", got, err)
	}
	// Shown on /metrics.
	rec := httptest.NewRecorder()
	c.metricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{`onehop_lisp_map_requests_total{outcome="rate_limited"} 20`, "onehop_lisp_map_replies_to_source_total 1",
		`onehop_lisp_map_requests_total{outcome="answered"} 9`} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("/metrics has no %q:\n%s", want, rec.Body.String())
		}
	}
}

func TestLISPMapServerStoresAnAuthenticatedRegistrationAndSendsMapNotify(t *testing.T) {
	c, _, srv, _ := lispServer(t, nil, dcSite)
	g := &lisp.Registrar{Server: srv.Addr(), KeyID: 1, Key: []byte("dc-site-secret"), WantMapNotify: true,
		Records: []lisp.Record{rec("10.99.1.0/24", "192.168.100.21", "192.168.100.22")}}
	if err := g.Register(t.Context()); err != nil {
		t.Fatal(err)
	}
	ms, err := c.ListLISPMappings(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Source != LISPSourceRegister || ms[0].Site != "dc" || len(ms[0].Locators) != 2 ||
		ms[0].Expires.Sub(ms[0].Updated) != lisp.RegistrationTimeout {
		t.Fatalf("stored %+v", ms)
	}
	got, err := lisp.NewResolver(srv.Addr()).Resolve(t.Context(), netip.MustParseAddr("10.99.1.5"))
	if err != nil || len(got.Locators) != 2 || got.Locators[1].Addr.String() != "192.168.100.22" {
		t.Fatalf("resolve: %+v, %v", got, err)
	}
	// Map-Notifies are counted once sent: the registrar may hold it first.
	testenv.Eventually(t, "the Map-Notify counted", 5*time.Second, func() bool { return c.LISPServerStats().Notifies == 1 })
	if st := c.LISPServerStats(); st.Registers != 1 || st.Notifies != 1 || len(st.RegistersRefused) != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A Map-Register that is unauthenticated, signed with the wrong key, for
// EIDs outside the site, or a replay of an accepted one is refused,
// counted by reason and logged at most 5 times a minute per source and
// reason, and the mappings stay as they were.
func TestLISPMapServerRefusesForgedRegistersAndChangesNothing(t *testing.T) {
	c, s, srv, logs := lispServer(t, nil, dcSite)
	good := lisp.MapRegister{Nonce: 100, WantMapNotify: false, Records: []lisp.Record{rec("10.99.1.0/24", "192.168.100.21")}}
	goodBytes, err := good.Seal(1, []byte("dc-site-secret"))
	if err != nil {
		t.Fatal(err)
	}
	sendRaw(t, srv.Addr(), goodBytes)
	testenv.Eventually(t, "the good register", 5*time.Second, func() bool { return c.LISPServerStats().Registers == 1 })
	before, _, err := s.List(t.Context(), intent.LISPMappingsPrefix)
	if err != nil {
		t.Fatal(err)
	}

	hijack := []lisp.Record{rec("10.99.1.0/24", "203.0.113.66")}
	unauth, _ := (&lisp.MapRegister{Nonce: 200, Records: hijack}).Encode()
	wrongKey, _ := (&lisp.MapRegister{Nonce: 201, Records: hijack}).Seal(1, []byte("guessed-secret"))
	otherEIDs, _ := (&lisp.MapRegister{Nonce: 202, Records: []lisp.Record{rec("10.50.0.0/16", "203.0.113.66")}}).Seal(1, []byte("dc-site-secret"))
	tampered := bytes.Clone(wrongKey)
	copy(tampered[16:32], goodBytes[16:32])
	for _, tc := range []struct {
		reason string
		b      []byte
	}{
		{refusedNoAuth, unauth}, {refusedBadAuth, wrongKey}, {refusedNoSite, otherEIDs},
		{refusedReplay, goodBytes}, {refusedBadAuth, tampered}, {refusedMalformed, goodBytes[:20]},
	} {
		n := c.LISPServerStats().RegistersRefused[tc.reason]
		sendRaw(t, srv.Addr(), tc.b)
		testenv.Eventually(t, tc.reason+" counted", 5*time.Second, func() bool { return c.LISPServerStats().RegistersRefused[tc.reason] == n+1 })
	}
	// A flood from one source: counted in full, logged at most 5 times.
	for range 30 {
		sendRaw(t, srv.Addr(), wrongKey)
	}
	testenv.Eventually(t, "the flood counted", 5*time.Second, func() bool { return c.LISPServerStats().RegistersRefused[refusedBadAuth] == 32 })
	after, _, err := s.List(t.Context(), intent.LISPMappingsPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) || !bytes.Equal(after[intent.LISPMappingsPrefix+"10.99.1.0_24"], before[intent.LISPMappingsPrefix+"10.99.1.0_24"]) {
		t.Fatalf("refused registers changed the mappings:\nbefore %s\nafter  %s", before, after)
	}
	got, err := lisp.NewResolver(srv.Addr()).Resolve(t.Context(), netip.MustParseAddr("10.99.1.1"))
	if err != nil || got.Locators[0].Addr.String() != "192.168.100.21" {
		t.Fatalf("resolve after the forgeries: %+v, %v", got, err)
	}
	if n := strings.Count(logs.String(), "reason=bad-auth"); n < 1 || n > 5 {
		t.Fatalf("%d log lines for bad-auth from one source, want 1 to 5:\n%s", n, logs.String())
	}
	if st := c.LISPServerStats(); st.Registers != 1 {
		t.Fatalf("stats %+v: only the good register may be accepted", st)
	}
}

func TestLISPRegistrationsExpireUnlessRefreshedAndTByTheirTTL(t *testing.T) {
	clock := newClock()
	c, s, srv, _ := lispServer(t, clock, dcSite)
	register := func(useTTL bool, r lisp.Record) {
		t.Helper()
		g := &lisp.Registrar{Server: srv.Addr(), KeyID: 1, Key: []byte("dc-site-secret"), WantMapNotify: true, UseTTL: useTTL, Records: []lisp.Record{r}}
		if err := g.Register(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	resolve := func(eid string) lisp.Record {
		t.Helper()
		got, err := lisp.NewResolver(srv.Addr()).Resolve(t.Context(), netip.MustParseAddr(eid))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	register(false, rec("10.99.1.0/24", "192.168.100.21"))
	register(true, rec("10.99.2.0/24", "192.168.100.22")) // T: 10-minute record TTL
	clock.Advance(lisp.RegistrationTimeout - time.Second)
	register(false, rec("10.99.1.0/24", "192.168.100.21")) // refreshed
	clock.Advance(2 * time.Second)
	if resolve("10.99.1.1").Negative() || resolve("10.99.2.1").Negative() {
		t.Fatal("a refreshed registration, or one whose TTL runs, was dropped")
	}
	clock.Advance(lisp.RegistrationTimeout)
	if !resolve("10.99.1.1").Negative() {
		t.Fatal("a registration not refreshed for 3 minutes is still answered")
	}
	if resolve("10.99.2.1").Negative() {
		t.Fatal("a registration with T was dropped before its 10-minute TTL")
	}
	testenv.Eventually(t, "the expired registration deleted from etcd", 5*time.Second, func() bool {
		_, err := s.Get(t.Context(), intent.LISPMappingsPrefix+"10.99.1.0_24")
		return errors.Is(err, store.ErrNotFound)
	})
	clock.Advance(5 * time.Minute)
	if !resolve("10.99.2.1").Negative() {
		t.Fatal("a registration with T outlived its TTL")
	}
	testenv.Eventually(t, "both expired", 5*time.Second, func() bool { return c.LISPServerStats().Expired == 2 })
}

func TestLISPRegisterForAnOperatorsEIDIsRefused(t *testing.T) {
	c, _, srv, _ := lispServer(t, nil, dcSite)
	if _, err := c.AddLISPMapping(t.Context(), LISPMappingBody{EID: "10.99.1.0/24", Locators: []LISPLocatorBody{{Addr: "192.168.100.11"}}}); err != nil {
		t.Fatal(err)
	}
	g := &lisp.Registrar{Server: srv.Addr(), KeyID: 1, Key: []byte("dc-site-secret"), WantMapNotify: true,
		Records: []lisp.Record{rec("10.99.1.0/24", "192.168.100.21")}, Timeout: 50 * time.Millisecond, Attempts: 1}
	if err := g.Register(t.Context()); !errors.Is(err, lisp.ErrNoReply) {
		t.Fatalf("register over an operator's mapping: %v, want no Map-Notify", err)
	}
	// The registrar gives up after 50 ms whether or not the server has got
	// to the datagram yet: await the refusal rather than assume it is done.
	testenv.Eventually(t, "the refusal counted", 5*time.Second, func() bool {
		return c.LISPServerStats().RegistersRefused[refusedOperatorMapped] == 1
	})
	m, err := c.GetLISPMapping(t.Context(), netip.MustParsePrefix("10.99.1.0/24"))
	if err != nil || m.Source != LISPSourceAPI || m.Locators[0].Addr != "192.168.100.11" {
		t.Fatalf("operator's mapping now %+v, %v", m, err)
	}
}

func TestLoadLISPSitesRefusesAFileOthersCanRead(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/keys"
	if err := writeFile(path, "dc 1 dc-site-secret 10.99.0.0/16\n", 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadLISPSites(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("mode 644: %v", err)
	}
	if err := writeFile(path, "dc 1 dc-site-secret 10.99.0.0/16\n", 0o600); err != nil {
		t.Fatal(err)
	}
	sites, err := LoadLISPSites(path)
	if err != nil || len(sites) != 1 || sites[0].Name != "dc" {
		t.Fatalf("mode 600: %+v, %v", sites, err)
	}
}

func writeFile(path, content string, mode os.FileMode) error {
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		return err
	}
	return os.Chmod(path, mode)
}

// The daemon's hook: `onehop controller --lisp-listen --lisp-site-keys`
// serves the map-server from the embedded etcd; a registration lands in
// etcd and is answered.
func TestControllerDaemonServesLISPRegistrationsFromEtcd(t *testing.T) {
	dir := t.TempDir()
	keys := dir + "/lisp-keys"
	if err := writeFile(keys, "dc 1 dc-site-secret 10.99.0.0/16\n", 0o600); err != nil {
		t.Fatal(err)
	}
	u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	lispAddr := u.LocalAddr().(*net.UDPAddr).AddrPort()
	u.Close()
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	cfg := DaemonConfig{DataDir: dir + "/etcd", ClientURL: clientURL, PeerURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		Insecure: true, LISPListen: lispAddr.String(), LISPSiteKeys: keys}
	exited := startController(t, cfg)
	g := &lisp.Registrar{Server: lispAddr, KeyID: 1, Key: []byte("dc-site-secret"), WantMapNotify: true,
		Records: []lisp.Record{rec("10.99.1.0/24", "192.168.100.21")}, Timeout: 200 * time.Millisecond, Attempts: 1}
	testenv.Eventually(t, "a Map-Notify from the daemon's map-server", 30*time.Second, func() error {
		err := g.Register(t.Context())
		if err != nil {
			select {
			case err := <-exited:
				t.Fatalf("controller exited: %v", err)
			default:
			}
		}
		return err
	})
	got, err := lisp.NewResolver(lispAddr).Resolve(t.Context(), netip.MustParseAddr("10.99.1.9"))
	if err != nil || len(got.Locators) != 1 || got.Locators[0].Addr.String() != "192.168.100.21" {
		t.Fatalf("resolve: %+v, %v", got, err)
	}
	s, err := store.DialEtcdTLS([]string{clientURL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var m LISPMapping
	if err := store.GetJSON(t.Context(), s, intent.LISPMappingsPrefix+"10.99.1.0_24", &m); err != nil || m.Site != "dc" || m.Source != LISPSourceRegister {
		t.Fatalf("in etcd: %+v, %v", m, err)
	}
}

func TestLISPSiteKeysWithoutListenIsRefusedUpFront(t *testing.T) {
	cfg := DaemonConfig{DataDir: t.TempDir(), ClientURL: "http://127.0.0.1:1", Insecure: true, LISPSiteKeys: "/nonexistent"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--lisp-site-keys without --lisp-listen") {
		t.Fatalf("validate: %v", err)
	}
}
