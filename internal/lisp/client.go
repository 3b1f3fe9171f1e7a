package lisp

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// ErrNoReply is Resolve's or Register's error when every attempt timed out.
var ErrNoReply = errors.New("lisp: no answer from the map-server")

// Defaults of the clients.
const (
	DefaultTimeout  = time.Second // wait for one answer
	DefaultAttempts = 3           // tries before ErrNoReply
	// DefaultRegisterInterval is how often an ETR re-registers (RFC 9301
	// §8.2: every 60 seconds); a map-server times out a registration not
	// refreshed for 3 intervals.
	DefaultRegisterInterval = time.Minute
	// DefaultCacheEntries bounds a Resolver's map-cache.
	DefaultCacheEntries = 4096
)

func newNonce() uint64 {
	var b [8]byte
	rand.Read(b[:]) // never fails (crypto/rand documents it)
	return binary.BigEndian.Uint64(b[:])
}

// ResolverStats counts what a Resolver did and, apart, what it refused.
type ResolverStats struct {
	Requests  uint64 `json:"requests"`  // Map-Requests sent (retries included)
	Replies   uint64 `json:"replies"`   // Map-Replies accepted
	CacheHits uint64 `json:"cacheHits"` // answers from the cache
	Negative  uint64 `json:"negative"`  // accepted replies that were negative
	Timeouts  uint64 `json:"timeouts"`  // attempts with no acceptable reply in time
	// Refused: datagrams that arrived on the request's socket and were
	// dropped.
	RefusedMalformed   uint64 `json:"refusedMalformed"`   // not a decodable Map-Reply
	RefusedNonce       uint64 `json:"refusedNonce"`       // a Map-Reply to another request
	RefusedNotCovering uint64 `json:"refusedNotCovering"` // no record covers the EID asked for
}

type cacheEntry struct {
	rec     Record
	expires time.Time
}

// Resolver asks a map-resolver for EID-to-RLOC mappings over UDP (RFC 9301
// §5.2-5.4) and caches each answer, positive or negative, for its record
// TTL. Its zero value is not usable: make one with NewResolver. Safe for
// concurrent use.
type Resolver struct {
	Server       netip.AddrPort
	Timeout      time.Duration    // one attempt; DefaultTimeout if 0
	Attempts     int              // DefaultAttempts if 0
	CacheEntries int              // DefaultCacheEntries if 0
	Now          func() time.Time // time.Now if nil
	// ECM sends the Map-Request inside an Encapsulated Control Message, as
	// RFC 9301 has ITRs do; false sends it bare (the controller's
	// map-resolver takes both).
	ECM bool

	mu       sync.Mutex
	cache    map[netip.Prefix]cacheEntry
	inflight map[netip.Addr]*inflight
	stats    ResolverStats
}

// inflight is a lookup on the wire that concurrent callers for the same
// EID wait for instead of sending their own.
type inflight struct {
	done chan struct{}
	rec  Record
	err  error
}

// NewResolver returns a resolver asking server (a map-resolver on UDP
// 4342, usually).
func NewResolver(server netip.AddrPort) *Resolver {
	return &Resolver{Server: server, cache: map[netip.Prefix]cacheEntry{}}
}

func (r *Resolver) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Stats returns the counters so far.
func (r *Resolver) Stats() ResolverStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Flush empties the cache.
func (r *Resolver) Flush() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.cache)
}

// Cached returns the cached record covering eid (the longest prefix) that
// has not expired.
func (r *Resolver) Cached(eid netip.Addr) (Record, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lookupLocked(eid)
}

func (r *Resolver) lookupLocked(eid netip.Addr) (Record, bool) {
	now := r.now()
	best, found := cacheEntry{}, false
	for p, e := range r.cache {
		if !now.Before(e.expires) {
			delete(r.cache, p)
			continue
		}
		if p.Contains(eid) && (!found || p.Bits() > best.rec.EID.Bits()) {
			best, found = e, true
		}
	}
	return best.rec.Clone(), found
}

func (r *Resolver) store(rec Record) {
	if rec.TTL <= 0 {
		return // TTL 0: use once, never cache (RFC 9301 §5.4)
	}
	limit := r.CacheEntries
	if limit <= 0 {
		limit = DefaultCacheEntries
	}
	if _, ok := r.cache[rec.EID]; !ok && len(r.cache) >= limit {
		// Full: drop the entry closest to expiry.
		var victim netip.Prefix
		var soonest time.Time
		for p, e := range r.cache {
			if victim == (netip.Prefix{}) || e.expires.Before(soonest) {
				victim, soonest = p, e.expires
			}
		}
		delete(r.cache, victim)
	}
	r.cache[rec.EID] = cacheEntry{rec: rec.Clone(), expires: r.now().Add(rec.TTL)}
}

func (r *Resolver) count(f func(*ResolverStats)) {
	r.mu.Lock()
	f(&r.stats)
	r.mu.Unlock()
}

// Resolve returns the mapping covering eid: from the cache while its TTL
// runs, else from the map-resolver, asked up to Attempts times. A negative
// mapping (no locators; its Action says what to do) is a result, not an
// error. Replies with another nonce, that do not decode or that cover
// another EID are refused, counted and waited past.
func (r *Resolver) Resolve(ctx context.Context, eid netip.Addr) (Record, error) {
	if !eid.IsValid() || eid.Zone() != "" {
		return Record{}, fmt.Errorf("lisp resolve: %q is not an IPv4 or IPv6 address", eid)
	}
	eid = eid.Unmap()
	for {
		r.mu.Lock()
		if r.cache == nil {
			r.cache = map[netip.Prefix]cacheEntry{}
		}
		if r.inflight == nil {
			r.inflight = map[netip.Addr]*inflight{}
		}
		if rec, ok := r.lookupLocked(eid); ok {
			r.stats.CacheHits++
			r.mu.Unlock()
			return rec, nil
		}
		if f, ok := r.inflight[eid]; ok {
			r.mu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				return Record{}, fmt.Errorf("lisp resolve %s: %w", eid, ctx.Err())
			}
			if f.err != nil && (errors.Is(f.err, context.Canceled) || errors.Is(f.err, context.DeadlineExceeded)) && ctx.Err() == nil {
				continue // the caller that asked gave up; ask again
			}
			return f.rec.Clone(), f.err
		}
		f := &inflight{done: make(chan struct{})}
		r.inflight[eid] = f
		r.mu.Unlock()
		f.rec, f.err = r.ask(ctx, eid)
		r.mu.Lock()
		delete(r.inflight, eid)
		r.mu.Unlock()
		close(f.done)
		return f.rec.Clone(), f.err
	}
}

// ask sends Map-Requests for eid until an acceptable reply, the attempts
// run out or ctx ends.
func (r *Resolver) ask(ctx context.Context, eid netip.Addr) (Record, error) {
	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(r.Server))
	if err != nil {
		return Record{}, fmt.Errorf("lisp resolve %s: %w", eid, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Now()) })
	defer stop()
	local := conn.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
	req := MapRequest{Nonce: newNonce(), ITRRLOCs: []netip.Addr{local}, EIDs: []netip.Prefix{netip.PrefixFrom(eid, eid.BitLen())}}
	msg, err := req.Encode()
	if err == nil && r.ECM {
		e := ECM{Source: conn.LocalAddr().(*net.UDPAddr).AddrPort(), Dest: netip.AddrPortFrom(eid, ControlPort), Message: msg}
		e.Source = netip.AddrPortFrom(local, e.Source.Port())
		if local.Is4() != eid.Is4() {
			// The inner header needs one family: the EID's is the
			// destination, so the source is the unspecified address of it.
			e.Source = netip.AddrPortFrom(netip.IPv6Unspecified(), e.Source.Port())
			if eid.Is4() {
				e.Source = netip.AddrPortFrom(netip.IPv4Unspecified(), e.Source.Port())
			}
		}
		msg, err = e.Encode()
	}
	if err != nil {
		return Record{}, fmt.Errorf("lisp resolve %s: %w", eid, err)
	}
	timeout, attempts := r.Timeout, r.Attempts
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	if attempts <= 0 {
		attempts = DefaultAttempts
	}
	buf := make([]byte, MaxMessageLen+1)
	for range attempts {
		if _, err := conn.Write(msg); err != nil {
			return Record{}, fmt.Errorf("lisp resolve %s: send map-request to %s: %w", eid, r.Server, err)
		}
		r.count(func(s *ResolverStats) { s.Requests++ })
		if err := conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
			return Record{}, err
		}
		for {
			if ctx.Err() != nil {
				return Record{}, fmt.Errorf("lisp resolve %s: %w", eid, ctx.Err())
			}
			n, err := conn.Read(buf)
			if errors.Is(err, net.ErrClosed) {
				return Record{}, fmt.Errorf("lisp resolve %s: %w", eid, err)
			}
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					break
				}
				// An ICMP port unreachable surfaces as a read error on a
				// connected socket: no resolver there yet; wait for the
				// timeout like a lost datagram.
				continue
			}
			rep, err := DecodeMapReply(buf[:n])
			if err != nil {
				r.count(func(s *ResolverStats) { s.RefusedMalformed++ })
				continue
			}
			if rep.Nonce != req.Nonce {
				r.count(func(s *ResolverStats) { s.RefusedNonce++ })
				continue
			}
			var hit *Record
			for i := range rep.Records {
				if rep.Records[i].EID.Contains(eid) && (hit == nil || rep.Records[i].EID.Bits() > hit.EID.Bits()) {
					hit = &rep.Records[i]
				}
			}
			if hit == nil {
				r.count(func(s *ResolverStats) { s.RefusedNotCovering++ })
				continue
			}
			r.mu.Lock()
			r.stats.Replies++
			if hit.Negative() {
				r.stats.Negative++
			}
			r.store(*hit)
			r.mu.Unlock()
			return hit.Clone(), nil
		}
		if ctx.Err() != nil {
			return Record{}, fmt.Errorf("lisp resolve %s: %w", eid, ctx.Err())
		}
		r.count(func(s *ResolverStats) { s.Timeouts++ })
	}
	return Record{}, fmt.Errorf("lisp resolve %s: %w (%s, %d attempts of %s)", eid, ErrNoReply, r.Server, attempts, timeout)
}

// RegistrarStats counts a Registrar's messages.
type RegistrarStats struct {
	Sent           uint64 `json:"sent"`           // Map-Registers sent
	Notified       uint64 `json:"notified"`       // Map-Notifies accepted
	Timeouts       uint64 `json:"timeouts"`       // attempts with no acceptable Map-Notify
	RefusedNotify  uint64 `json:"refusedNotify"`  // Map-Notifies that did not decode, authenticate or match the nonce
	FailedRegister uint64 `json:"failedRegister"` // registrations that got no Map-Notify after every attempt
}

// Registrar is an ETR's registration with a map-server (RFC 9301 §8.2):
// authenticated Map-Registers for Records every Interval, and, when
// WantMapNotify is set, a wait for the map-server's Map-Notify, which must
// carry the nonce and authenticate with the same key.
type Registrar struct {
	Server        netip.AddrPort
	KeyID         uint8
	Key           []byte
	Records       []Record
	Interval      time.Duration // DefaultRegisterInterval if 0
	WantMapNotify bool
	ProxyReply    bool          // P: ask the map-server to answer Map-Requests itself
	UseTTL        bool          // T: the map-server times the records out by their TTL
	Timeout       time.Duration // wait for a Map-Notify; DefaultTimeout if 0
	Attempts      int           // DefaultAttempts if 0
	Log           *slog.Logger  // nil: no logging

	nonce atomic.Uint64
	mu    sync.Mutex
	stats RegistrarStats
}

// Stats returns the counters so far.
func (g *Registrar) Stats() RegistrarStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stats
}

func (g *Registrar) count(f func(*RegistrarStats)) {
	g.mu.Lock()
	f(&g.stats)
	g.mu.Unlock()
}

// nextNonce increments the nonce, which a map-server requires to grow
// (replay protection, RFC 9301 §5.6). It starts from the clock in
// nanoseconds so that a restarted xTR does not fall below the nonce its
// previous run reached.
func (g *Registrar) nextNonce() uint64 {
	for {
		old := g.nonce.Load()
		next := old + 1
		if now := uint64(time.Now().UnixNano()); now > next {
			next = now
		}
		if g.nonce.CompareAndSwap(old, next) {
			return next
		}
	}
}

// Register sends one registration. With WantMapNotify it returns only once
// a valid Map-Notify arrived (retrying up to Attempts times), ErrNoReply
// otherwise; without it, once the Map-Register is sent.
func (g *Registrar) Register(ctx context.Context) error {
	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(g.Server))
	if err != nil {
		return fmt.Errorf("lisp register: %w", err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Now()) })
	defer stop()
	m := MapRegister{Nonce: g.nextNonce(), ProxyReply: g.ProxyReply, UseTTL: g.UseTTL, WantMapNotify: g.WantMapNotify, Records: g.Records}
	msg, err := m.Seal(g.KeyID, g.Key)
	if err != nil {
		return fmt.Errorf("lisp register: %w", err)
	}
	timeout, attempts := g.Timeout, g.Attempts
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	if attempts <= 0 {
		attempts = DefaultAttempts
	}
	if !g.WantMapNotify {
		attempts = 1
	}
	buf := make([]byte, MaxMessageLen+1)
	for range attempts {
		if _, err := conn.Write(msg); err != nil {
			return fmt.Errorf("lisp register: send to %s: %w", g.Server, err)
		}
		g.count(func(s *RegistrarStats) { s.Sent++ })
		if !g.WantMapNotify {
			return nil
		}
		if err := conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
			return err
		}
		for {
			if ctx.Err() != nil {
				return fmt.Errorf("lisp register: %w", ctx.Err())
			}
			n, err := conn.Read(buf)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					break
				}
				if errors.Is(err, net.ErrClosed) {
					return fmt.Errorf("lisp register: %w", err)
				}
				continue
			}
			nt, err := DecodeMapNotify(buf[:n])
			if err == nil && nt.Nonce != m.Nonce {
				err = fmt.Errorf("nonce %#x, want %#x", nt.Nonce, m.Nonce)
			}
			if err == nil {
				err = Authenticate(buf[:n], g.Key)
			}
			if err != nil {
				g.count(func(s *RegistrarStats) { s.RefusedNotify++ })
				if g.Log != nil {
					g.Log.Warn("lisp: map-notify refused", "from", g.Server, "err", err)
				}
				continue
			}
			g.count(func(s *RegistrarStats) { s.Notified++ })
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("lisp register: %w", ctx.Err())
		}
		g.count(func(s *RegistrarStats) { s.Timeouts++ })
	}
	g.count(func(s *RegistrarStats) { s.FailedRegister++ })
	return fmt.Errorf("lisp register: %w: no Map-Notify from %s after %d attempts", ErrNoReply, g.Server, attempts)
}

// Run registers now and every Interval until ctx ends; a failed
// registration is logged and tried again at the next interval.
func (g *Registrar) Run(ctx context.Context) error {
	every := g.Interval
	if every <= 0 {
		every = DefaultRegisterInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := g.Register(ctx); err != nil && ctx.Err() == nil && g.Log != nil {
			g.Log.Warn("lisp: registration failed", "map_server", g.Server, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Register sends one authenticated Map-Register for records to server and
// waits for its Map-Notify: the one-shot form of Registrar.
func Register(ctx context.Context, server netip.AddrPort, keyID uint8, key []byte, records []Record) error {
	g := &Registrar{Server: server, KeyID: keyID, Key: key, Records: records, WantMapNotify: true}
	return g.Register(ctx)
}
