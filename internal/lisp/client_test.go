package lisp

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
)

// fakeServer is a UDP map-server on loopback whose answer to each datagram
// the test decides.
type fakeServer struct {
	conn     *net.UDPConn
	requests atomic.Int32
	wg       sync.WaitGroup
}

// startServer answers each datagram with what handle returns (nil: none).
func startServer(t *testing.T, handle func(n int, msg []byte) [][]byte) *fakeServer {
	t.Helper()
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeServer{conn: c}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		buf := make([]byte, 65536)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			k := int(s.requests.Add(1))
			for _, out := range handle(k, append([]byte(nil), buf[:n]...)) {
				if _, err := c.WriteToUDPAddrPort(out, from); err != nil {
					return
				}
			}
		}
	}()
	t.Cleanup(func() { c.Close(); s.wg.Wait() })
	return s
}

func (s *fakeServer) addr() netip.AddrPort { return s.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// reply answers the request msg with recs under the request's nonce, or
// under nonce^flip.
func reply(t *testing.T, msg []byte, flip uint64, recs ...Record) []byte {
	req, err := DecodeMapRequest(msg)
	if err != nil {
		t.Errorf("the server got a bad request: %v", err)
		return nil
	}
	b, err := (&MapReply{Nonce: req.Nonce ^ flip, Records: recs}).Encode()
	if err != nil {
		t.Errorf("encode reply: %v", err)
	}
	return b
}

func TestResolverRefusesWrongNonceAndGarbageThenAcceptsTheReplyAndCachesIt(t *testing.T) {
	rec := goldenRec()
	var mu sync.Mutex // the server's goroutine writes, the test reads
	var asked netip.Prefix
	var itr netip.Addr
	s := startServer(t, func(n int, msg []byte) [][]byte {
		req, _ := DecodeMapRequest(msg)
		mu.Lock()
		asked, itr = req.EIDs[0], req.ITRRLOCs[0]
		mu.Unlock()
		return [][]byte{reply(t, msg, 1, rec), []byte("garbage"), reply(t, msg, 0, Record{EID: pfx("10.9.0.0/16"), TTL: time.Minute}), reply(t, msg, 0, rec)}
	})
	r := NewResolver(s.addr())
	got, err := r.Resolve(context.Background(), addr("10.1.2.3"))
	if err != nil {
		t.Fatal(err)
	}
	if got.EID != rec.EID || len(got.Locators) != 2 || got.Locators[0].Addr != addr("192.0.2.10") {
		t.Fatalf("got %+v, want %+v", got, rec)
	}
	mu.Lock()
	defer mu.Unlock()
	if asked != pfx("10.1.2.3/32") || itr != addr("127.0.0.1") {
		t.Fatalf("the request asked for %s with ITR-RLOC %s, want 10.1.2.3/32 and 127.0.0.1", asked, itr)
	}
	// Another EID of the same prefix comes from the cache.
	if _, err := r.Resolve(context.Background(), addr("10.1.200.1")); err != nil {
		t.Fatal(err)
	}
	st := r.Stats()
	want := ResolverStats{Requests: 1, Replies: 1, CacheHits: 1, RefusedNonce: 1, RefusedMalformed: 1, RefusedNotCovering: 1}
	if st != want || s.requests.Load() != 1 {
		t.Fatalf("stats %+v after %d requests on the wire; want %+v after 1", st, s.requests.Load(), want)
	}
}

func TestResolverRetriesLostRequestsUpToItsBound(t *testing.T) {
	s := startServer(t, func(n int, msg []byte) [][]byte {
		if n < 3 {
			return nil // lose the first two
		}
		return [][]byte{reply(t, msg, 0, goldenRec())}
	})
	r := NewResolver(s.addr())
	r.Timeout, r.Attempts = 50*time.Millisecond, 2
	_, err := r.Resolve(context.Background(), addr("10.1.2.3"))
	if !errors.Is(err, ErrNoReply) {
		t.Fatalf("2 attempts, 2 lost: got %v, want ErrNoReply", err)
	}
	if st := r.Stats(); st.Requests != 2 || st.Timeouts != 2 {
		t.Fatalf("stats %+v: want 2 requests, 2 timeouts", st)
	}
	r.Attempts = 3
	if _, err := r.Resolve(context.Background(), addr("10.1.2.3")); err != nil {
		t.Fatalf("3rd request answered: %v", err)
	}
}

func TestResolverCachesNegativeRepliesAndForgetsEntriesWhenTheirTTLEnds(t *testing.T) {
	now := time.Unix(1000, 0)
	s := startServer(t, func(n int, msg []byte) [][]byte {
		req, _ := DecodeMapRequest(msg)
		return [][]byte{reply(t, msg, 0, Answer([]Record{goldenRec()}, req.EIDs[0].Addr()))}
	})
	r := NewResolver(s.addr())
	r.Now = func() time.Time { return now }
	neg, err := r.Resolve(context.Background(), addr("10.2.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	// 10.0.0.0/15 holds the mapped 10.1.0.0/16; 10.2.0.0/15 is the
	// shortest prefix around 10.2.0.1 that overlaps no mapping.
	if !neg.Negative() || neg.Action != ActionNativelyForward || neg.EID != pfx("10.2.0.0/15") || neg.TTL != NegativeTTL {
		t.Fatalf("negative answer %+v", neg)
	}
	if _, err := r.Resolve(context.Background(), addr("10.3.255.255")); err != nil {
		t.Fatal(err)
	}
	if n := s.requests.Load(); n != 1 {
		t.Fatalf("%d requests: the negative answer for 10.2.0.0/15 was not cached", n)
	}
	now = now.Add(NegativeTTL)
	if _, err := r.Resolve(context.Background(), addr("10.3.255.255")); err != nil {
		t.Fatal(err)
	}
	if n := s.requests.Load(); n != 2 {
		t.Fatalf("%d requests: the negative answer outlived its TTL", n)
	}
	if _, ok := r.Cached(addr("10.1.0.1")); ok {
		t.Fatal("10.1.0.1 cached before it was asked for")
	}
}

func TestResolverGivesUpWhenItsContextEnds(t *testing.T) {
	s := startServer(t, func(int, []byte) [][]byte { return nil })
	r := NewResolver(s.addr())
	r.Timeout, r.Attempts = time.Hour, 1
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := r.Resolve(ctx, addr("10.1.2.3")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the context's deadline", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %s after the context ended", d)
	}
}

// mapServer is a fake map-server that authorizes Map-Registers against
// sites and answers the valid ones with a Map-Notify sealed with notifyKey
// (the site's key unless the test forges).
func mapServer(t *testing.T, sites []Site, forge []byte, accepted *atomic.Int32) *fakeServer {
	return startServer(t, func(n int, msg []byte) [][]byte {
		m, site, err := Authorize(msg, sites)
		if err != nil {
			return nil
		}
		accepted.Add(1)
		if !m.WantMapNotify {
			return nil
		}
		key := site.Key
		if forge != nil {
			key = forge
		}
		nt := MapNotify{Nonce: m.Nonce, Records: m.Records}
		b, err := nt.Seal(m.KeyID, key)
		if err != nil {
			t.Errorf("seal notify: %v", err)
		}
		return [][]byte{b}
	})
}

func TestRegistrarGetsAnAuthenticatedMapNotifyAndIncrementsItsNonce(t *testing.T) {
	sites := []Site{{Name: "dc", KeyID: 3, Key: []byte("dc-site-secret"), EIDs: []netip.Prefix{pfx("10.0.0.0/8")}}}
	var accepted atomic.Int32
	s := mapServer(t, sites, nil, &accepted)
	g := &Registrar{Server: s.addr(), KeyID: 3, Key: []byte("dc-site-secret"), Records: []Record{goldenRec()}, WantMapNotify: true}
	for range 2 {
		if err := g.Register(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if st := g.Stats(); st.Sent != 2 || st.Notified != 2 || accepted.Load() != 2 {
		t.Fatalf("stats %+v, %d accepted: want 2 sent, 2 notified", st, accepted.Load())
	}
	first := g.nonce.Load()
	g.nextNonce()
	if g.nonce.Load() <= first {
		t.Fatal("the nonce did not grow")
	}
	if err := Register(context.Background(), s.addr(), 3, []byte("dc-site-secret"), []Record{goldenRec()}); err != nil {
		t.Fatalf("one-shot Register: %v", err)
	}
}

func TestRegistrarWithTheWrongKeyGetsNoNotifyAndRefusesAForgedOne(t *testing.T) {
	sites := []Site{{Name: "dc", KeyID: 3, Key: []byte("dc-site-secret"), EIDs: []netip.Prefix{pfx("10.0.0.0/8")}}}
	var accepted atomic.Int32
	s := mapServer(t, sites, nil, &accepted)
	g := &Registrar{Server: s.addr(), KeyID: 3, Key: []byte("not-the-site-key"), Records: []Record{goldenRec()},
		WantMapNotify: true, Timeout: 50 * time.Millisecond, Attempts: 2}
	if err := g.Register(context.Background()); !errors.Is(err, ErrNoReply) || accepted.Load() != 0 {
		t.Fatalf("wrong key: %v with %d accepted; want ErrNoReply and none", err, accepted.Load())
	}
	// A map-server that signs its Map-Notify with another key is not
	// believed.
	forger := mapServer(t, sites, []byte("forged-notify-key"), &accepted)
	g = &Registrar{Server: forger.addr(), KeyID: 3, Key: []byte("dc-site-secret"), Records: []Record{goldenRec()},
		WantMapNotify: true, Timeout: 50 * time.Millisecond, Attempts: 1}
	if err := g.Register(context.Background()); !errors.Is(err, ErrNoReply) {
		t.Fatalf("forged notify: %v, want ErrNoReply", err)
	}
	if st := g.Stats(); st.RefusedNotify != 1 || st.Notified != 0 {
		t.Fatalf("stats %+v: want the forged notify refused", st)
	}
}

// Concurrent lookups of one EID share one Map-Request.
func TestResolverSendsOneRequestForConcurrentLookupsOfOneEID(t *testing.T) {
	release := make(chan struct{})
	s := startServer(t, func(n int, msg []byte) [][]byte {
		<-release // hold the answer until every caller waits
		return [][]byte{reply(t, msg, 0, goldenRec())}
	})
	r := NewResolver(s.addr())
	const callers = 8
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := r.Resolve(context.Background(), addr("10.1.2.3"))
			errs <- err
		}()
	}
	testenv.Eventually(t, "every caller waiting on one Map-Request", 5*time.Second, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.inflight) == 1 && s.requests.Load() == 1
	})
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := s.requests.Load(); n != 1 {
		t.Fatalf("%d Map-Requests for %d concurrent lookups of one EID, want 1", n, callers)
	}
}
