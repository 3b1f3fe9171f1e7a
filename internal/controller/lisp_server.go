package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lisp"
	"github.com/onehop/onehop/internal/ratelog"
	"github.com/onehop/onehop/internal/store"
)

// LISPServerConfig configures the controller's LISP map-server and
// map-resolver (RFC 9301): it answers Map-Requests from the mappings in
// etcd and takes authenticated Map-Registers from the sites it knows.
type LISPServerConfig struct {
	Listen string      // UDP address, e.g. 192.168.100.1:4342 (the controller's fabric address)
	Sites  []lisp.Site // who may register what, with which key; none: every Map-Register is refused
	// Sweep is how often registrations past their expiry are deleted from
	// etcd (10 s if 0); the server stops answering with them at expiry
	// whatever the sweep.
	Sweep time.Duration
	Now   func() time.Time // time.Now if nil
	// RequestRate and RequestBurst bound the Map-Requests answered for
	// one source address (a second, at once), TotalRate and TotalBurst
	// those of all sources together (RFC 9301 §5.3 has Map-Requests
	// rate-limited); 0 takes the Default* values.
	RequestRate, RequestBurst float64
	TotalRate, TotalBurst     float64
}

// Default rate limits of the map-resolver. An ITR asks once per EID
// prefix and caches the answer for its TTL (the gateway and the xTR do),
// so one source rarely needs more than a few a second; 50 a second from
// one source, or 2,000 from all, is a flood.
const (
	DefaultLISPRequestRate  = 50
	DefaultLISPRequestBurst = 100
	DefaultLISPTotalRate    = 2000
	DefaultLISPTotalBurst   = 4000
)

// LISPServerStats is what the map-server counted (GET /v1/lisp/server).
type LISPServerStats struct {
	Listen          string `json:"listen"` // empty: no map-server runs
	Sites           int    `json:"sites"`
	Requests        uint64 `json:"requests"`        // Map-Requests answered
	NegativeReplies uint64 `json:"negativeReplies"` // of which negative
	RequestsRefused uint64 `json:"requestsRefused"` // datagrams on 4342 that were no Map-Request or Map-Register it could read
	// RequestsRateLimited: Map-Requests not answered, their source or all
	// sources together over the rate limit.
	RequestsRateLimited uint64 `json:"requestsRateLimited"`
	// RepliesToSource: Map-Replies sent back to the ECM's sender instead of
	// the ITR-RLOC it named, another address, because the reply was larger
	// than the request (no amplification towards a third address).
	RepliesToSource  uint64            `json:"repliesToSource"`
	Registers        uint64            `json:"registers"`        // Map-Registers accepted
	RegistersRefused map[string]uint64 `json:"registersRefused"` // by reason
	Notifies         uint64            `json:"notifies"`         // Map-Notifies sent
	Expired          uint64            `json:"expired"`          // registrations deleted at expiry
}

// The reasons a Map-Register is refused, as counted.
const (
	refusedMalformed      = "malformed"
	refusedNoAuth         = "unauthenticated"
	refusedAlgorithm      = "unsupported-algorithm"
	refusedNoSite         = "unknown-site"
	refusedBadAuth        = "bad-auth"
	refusedReplay         = "replayed-nonce"
	refusedOperatorMapped = "operator-mapping"
	refusedStore          = "store-error"
)

// LISPServer is a running map-server.
type LISPServer struct {
	c     *Controller
	cfg   LISPServerConfig
	conn  *net.UDPConn
	log   *slog.Logger
	limit *ratelog.Logger
	rate  *lisp.Limiter // Map-Requests answered per source and in total

	mu       sync.Mutex
	held     []LISPMapping
	heldRev  int64             // the store revision held was read at
	nonces   map[string]uint64 // site + key id -> last accepted Map-Register nonce
	stats    LISPServerStats
	changed  chan struct{}
	finished chan struct{}
}

// lispServers holds each controller's map-server, kept out of Controller's
// struct so the feature stays in its own files.
var lispServers sync.Map // *Controller -> *LISPServer

func (c *Controller) lispServer() *LISPServer {
	if v, ok := lispServers.Load(c); ok {
		return v.(*LISPServer)
	}
	return nil
}

// lispChanged makes a running map-server answer from the mappings as they
// are now: it re-reads them before the API call that changed them returns,
// so a Map-Request sent after a 200 is answered with the change (the watch
// alone would leave a window in which the old copy answers).
func (c *Controller) lispChanged(ctx context.Context) {
	s := c.lispServer()
	if s == nil {
		return
	}
	if _, err := s.reload(ctx); err != nil {
		s.limit.Warn("lisp-reload", "lisp map-server: reading mappings failed; the watch will retry", "err", err)
		select {
		case s.changed <- struct{}{}:
		default:
		}
	}
}

// LISPServerStats returns the running map-server's counters (Listen empty
// if none runs).
func (c *Controller) LISPServerStats() LISPServerStats {
	s := c.lispServer()
	if s == nil {
		return LISPServerStats{RegistersRefused: map[string]uint64{}}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.stats
	out.RegistersRefused = make(map[string]uint64, len(s.stats.RegistersRefused))
	for k, v := range s.stats.RegistersRefused {
		out.RegistersRefused[k] = v
	}
	return out
}

// LoadLISPSites reads a site-keys file (lisp.ParseSites' format). It must
// not be readable by others: it holds the sites' secrets.
func LoadLISPSites(path string) ([]lisp.Site, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("lisp site keys: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("lisp site keys %s: mode %v lets others read the secrets: chmod 600 it", path, fi.Mode().Perm())
	}
	return lisp.ParseSites(f, path)
}

// ServeLISP starts the map-server on cfg.Listen; it stops when ctx ends
// (Done tells when it has).
func (c *Controller) ServeLISP(ctx context.Context, cfg LISPServerConfig) (*LISPServer, error) {
	ap, err := netip.ParseAddrPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("lisp listen %q: want IP:PORT, e.g. 192.168.100.1:4342: %w", cfg.Listen, err)
	}
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap))
	if err != nil {
		return nil, fmt.Errorf("lisp map-server: %w", err)
	}
	if cfg.Sweep <= 0 {
		cfg.Sweep = 10 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	for _, v := range []struct {
		p *float64
		d float64
	}{{&cfg.RequestRate, DefaultLISPRequestRate}, {&cfg.RequestBurst, DefaultLISPRequestBurst},
		{&cfg.TotalRate, DefaultLISPTotalRate}, {&cfg.TotalBurst, DefaultLISPTotalBurst}} {
		if *v.p <= 0 {
			*v.p = v.d
		}
	}
	s := &LISPServer{c: c, cfg: cfg, conn: conn, log: c.log, limit: ratelog.New(c.log, 5, time.Minute, nil),
		rate:   &lisp.Limiter{Rate: cfg.RequestRate, Burst: cfg.RequestBurst, TotalRate: cfg.TotalRate, TotalBurst: cfg.TotalBurst},
		nonces: map[string]uint64{}, changed: make(chan struct{}, 1), finished: make(chan struct{})}
	s.stats = LISPServerStats{Listen: conn.LocalAddr().String(), Sites: len(cfg.Sites), RegistersRefused: map[string]uint64{}}
	if _, err := s.reload(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	lispServers.Store(c, s)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.watch(ctx) }()
	go func() { defer wg.Done(); s.serve(ctx) }()
	go func() {
		<-ctx.Done()
		conn.Close()
		wg.Wait()
		lispServers.CompareAndDelete(c, s)
		close(s.finished)
	}()
	c.log.Info("lisp map-server listening", "on", s.stats.Listen, "sites", len(cfg.Sites))
	return s, nil
}

// Addr is the UDP address the server listens on.
func (s *LISPServer) Addr() netip.AddrPort { return s.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// Done is closed once the server has stopped.
func (s *LISPServer) Done() <-chan struct{} { return s.finished }

// reload reads the mappings from etcd and returns the revision it read.
// Reloads run concurrently (the watch, the API, Map-Registers): a copy read
// at an older revision than the one held is dropped, not put back.
func (s *LISPServer) reload(ctx context.Context) (int64, error) {
	all, rev, err := store.ListJSON[LISPMapping](ctx, s.c.store, intent.LISPMappingsPrefix)
	if err != nil {
		return 0, fmt.Errorf("lisp map-server: read mappings: %w", err)
	}
	s.mu.Lock()
	if rev >= s.heldRev {
		s.held, s.heldRev = all, rev
	}
	s.mu.Unlock()
	return rev, nil
}

// watch keeps the mappings in step with etcd (another controller, the API)
// and deletes registrations past their expiry every Sweep.
func (s *LISPServer) watch(ctx context.Context) {
	tick := time.NewTicker(s.cfg.Sweep)
	defer tick.Stop()
	for ctx.Err() == nil {
		rev, err := s.reload(ctx)
		if err != nil {
			s.limit.Warn("lisp-reload", "lisp map-server: reading mappings failed; answering from the last copy", "err", err)
		}
		wctx, cancel := context.WithCancel(ctx)
		ch := s.c.store.Watch(wctx, intent.LISPMappingsPrefix, rev)
		select {
		case <-ctx.Done():
		case <-ch:
		case <-s.changed:
		case <-tick.C:
			s.sweep(ctx)
		}
		cancel()
	}
}

// sweep deletes registrations past their expiry.
func (s *LISPServer) sweep(ctx context.Context) {
	lispMu.Lock()
	defer lispMu.Unlock()
	all, _, err := store.ListJSON[LISPMapping](ctx, s.c.store, intent.LISPMappingsPrefix)
	if err != nil {
		return
	}
	now := s.cfg.Now()
	for _, m := range all {
		if m.live(now) {
			continue
		}
		p, err := netip.ParsePrefix(m.EID)
		if err != nil {
			continue
		}
		if err := s.c.store.Delete(ctx, intent.LISPMappingKey(p)); err == nil {
			s.mu.Lock()
			s.stats.Expired++
			s.mu.Unlock()
			s.log.Info("lisp: registration expired", "eid", m.EID, "site", m.Site, "expired", m.Expires)
		}
	}
}

func (s *LISPServer) serve(ctx context.Context) {
	buf := make([]byte, lisp.MaxMessageLen+1)
	for {
		n, from, err := s.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		msg := buf[:n]
		t, _ := lisp.MessageType(msg)
		switch t {
		case lisp.TypeMapRequest:
			s.mapRequest(msg, n, from, from)
		case lisp.TypeECM:
			s.ecm(msg, from)
		case lisp.TypeMapRegister:
			s.mapRegister(ctx, msg, from)
		default:
			s.mu.Lock()
			s.stats.RequestsRefused++
			s.mu.Unlock()
			s.limit.Warn("lisp-bad:"+from.Addr().String(), "lisp map-server: refused a datagram", "from", from,
				"err", fmt.Sprintf("type %d (%s): this map-server takes Map-Requests (1, bare or in an ECM, 8) and Map-Registers (3)", uint8(t), t))
		}
	}
}

// records are the live mappings as records.
func (s *LISPServer) records() []lisp.Record {
	s.mu.Lock()
	held := s.held
	s.mu.Unlock()
	now := s.cfg.Now()
	out := make([]lisp.Record, 0, len(held))
	for _, m := range held {
		if !m.live(now) {
			continue
		}
		if r, err := m.Record(); err == nil {
			out = append(out, r)
		}
	}
	return out
}

// ecm answers the Map-Request an ECM carries (RFC 9301 §5.8) at the
// request's first ITR-RLOC of the sender's address family, on the inner
// UDP source port.
func (s *LISPServer) ecm(msg []byte, from netip.AddrPort) {
	e, err := lisp.DecodeECM(msg)
	if err == nil {
		if t, _ := lisp.MessageType(e.Message); t != lisp.TypeMapRequest {
			err = fmt.Errorf("ecm carries a %s: this map-resolver takes Map-Requests", t)
		}
	}
	if err != nil {
		s.mu.Lock()
		s.stats.RequestsRefused++
		s.mu.Unlock()
		s.limit.Warn("lisp-bad:"+from.Addr().String(), "lisp map-server: refused an ECM", "from", from, "err", err)
		return
	}
	to := netip.AddrPortFrom(from.Addr(), e.Source.Port())
	if req, err := lisp.DecodeMapRequest(e.Message); err == nil {
		for _, a := range req.ITRRLOCs {
			if a.Is4() == from.Addr().Unmap().Is4() {
				to = netip.AddrPortFrom(a, e.Source.Port())
				break
			}
		}
	}
	s.mapRequest(e.Message, len(msg), from, to)
}

// mapRequest answers a Map-Request that came from from in a datagram of
// size bytes, sending the Map-Reply to to (RFC 9301 §5.4: the reply goes to
// the request's UDP source port), within the rate limits of from. A reply
// larger than its request goes back to from whatever to says: a forged
// ITR-RLOC may aim replies at a third address, but never more bytes than
// the forger sent. (The limit is charged to the sender only: charging the
// named ITR-RLOC too would let anyone starve that address's own lookups.)
func (s *LISPServer) mapRequest(msg []byte, size int, from, to netip.AddrPort) {
	req, err := lisp.DecodeMapRequest(msg)
	if err != nil {
		s.mu.Lock()
		s.stats.RequestsRefused++
		s.mu.Unlock()
		s.limit.Warn("lisp-bad:"+from.Addr().String(), "lisp map-server: refused a Map-Request", "from", from, "err", err)
		return
	}
	if !s.rate.Allow(s.cfg.Now(), from.Addr()) {
		s.mu.Lock()
		s.stats.RequestsRateLimited++
		s.mu.Unlock()
		s.limit.Warn("lisp-rate:"+from.Addr().String(), "lisp map-server: Map-Requests over the rate limit; not answered",
			"from", from, "per_source", s.cfg.RequestRate, "total", s.cfg.TotalRate)
		return
	}
	held := s.records()
	rep := lisp.MapReply{Nonce: req.Nonce}
	negative := 0
	for _, eid := range req.EIDs {
		rec := lisp.Answer(held, eid.Addr())
		if rec.Negative() {
			negative++
		}
		rep.Records = append(rep.Records, rec)
	}
	b, err := rep.Encode()
	if err != nil {
		s.limit.Warn("lisp-encode", "lisp map-server: cannot encode a Map-Reply", "err", err)
		return
	}
	redirected := false
	if to.Addr().Unmap() != from.Addr().Unmap() && len(b) > size {
		s.limit.Warn("lisp-redirect:"+from.Addr().String(), "lisp map-server: a Map-Reply larger than its request goes back to the sender, not to the ITR-RLOC it named",
			"from", from, "itr_rloc", to, "request", size, "reply", len(b))
		to, redirected = from, true
	}
	if _, err := s.conn.WriteToUDPAddrPort(b, to); err != nil {
		s.limit.Warn("lisp-send:"+to.Addr().String(), "lisp map-server: send Map-Reply", "to", to, "err", err)
		return
	}
	s.mu.Lock()
	s.stats.Requests++
	s.stats.NegativeReplies += uint64(negative)
	if redirected {
		s.stats.RepliesToSource++
	}
	s.mu.Unlock()
}

func (s *LISPServer) refuse(reason string, from netip.AddrPort, err error) {
	s.mu.Lock()
	s.stats.RegistersRefused[reason]++
	s.mu.Unlock()
	s.limit.Warn("lisp-register:"+reason+":"+from.Addr().String(), "lisp map-server: refused a Map-Register",
		"from", from, "reason", reason, "err", err)
}

// mapRegister stores an authenticated registration and, if asked,
// acknowledges it with a Map-Notify. Anything else changes nothing.
func (s *LISPServer) mapRegister(ctx context.Context, msg []byte, from netip.AddrPort) {
	m, site, err := lisp.Authorize(msg, s.cfg.Sites)
	var de *lisp.Error
	switch {
	case err == nil:
	case errors.As(err, &de):
		s.refuse(refusedMalformed, from, err)
		return
	case errors.Is(err, lisp.ErrNoAuth):
		s.refuse(refusedNoAuth, from, err)
		return
	case errors.Is(err, lisp.ErrUnsupportedAlgorithm):
		s.refuse(refusedAlgorithm, from, err)
		return
	case errors.Is(err, lisp.ErrNoSite):
		s.refuse(refusedNoSite, from, err)
		return
	default:
		s.refuse(refusedBadAuth, from, err)
		return
	}
	lispMu.Lock()
	nonceKey := fmt.Sprintf("%s/%d", site.Name, m.KeyID)
	s.mu.Lock()
	last, seen := s.nonces[nonceKey]
	s.mu.Unlock()
	if seen && m.Nonce <= last {
		lispMu.Unlock()
		s.refuse(refusedReplay, from, fmt.Errorf("nonce %#x is not above the last accepted %#x (site %s key %d)", m.Nonce, last, site.Name, m.KeyID))
		return
	}
	now := s.cfg.Now()
	for _, r := range m.Records {
		var old LISPMapping
		err := store.GetJSON(ctx, s.c.store, intent.LISPMappingKey(r.EID), &old)
		if err == nil && old.Source == LISPSourceAPI {
			lispMu.Unlock()
			s.refuse(refusedOperatorMapped, from, fmt.Errorf("eid %s has an operator's mapping (onehop lisp map delete %s to let the site register it)", r.EID, r.EID))
			return
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			lispMu.Unlock()
			s.refuse(refusedStore, from, err)
			return
		}
	}
	for _, r := range m.Records {
		expires := now.Add(lisp.RegistrationTimeout)
		if m.UseTTL {
			expires = now.Add(r.TTL)
		}
		if err := store.PutJSON(ctx, s.c.store, intent.LISPMappingKey(r.EID), mappingOfRecord(r, site.Name, now, expires)); err != nil {
			lispMu.Unlock()
			s.refuse(refusedStore, from, err)
			return
		}
	}
	s.mu.Lock()
	s.nonces[nonceKey] = m.Nonce
	s.stats.Registers++
	s.mu.Unlock()
	lispMu.Unlock()
	if _, err := s.reload(ctx); err != nil {
		s.limit.Warn("lisp-reload", "lisp map-server: reading mappings failed", "err", err)
	}
	if !m.WantMapNotify {
		return
	}
	nt := lisp.MapNotify{Nonce: m.Nonce, Records: m.Records}
	b, err := nt.Seal(m.KeyID, site.Key)
	if err != nil {
		s.limit.Warn("lisp-encode", "lisp map-server: cannot encode a Map-Notify", "err", err)
		return
	}
	if _, err := s.conn.WriteToUDPAddrPort(b, from); err != nil {
		s.limit.Warn("lisp-send:"+from.Addr().String(), "lisp map-server: send Map-Notify", "to", from, "err", err)
		return
	}
	s.mu.Lock()
	s.stats.Notifies++
	s.mu.Unlock()
}

// startLISP is the daemon's hook: the site keys from cfg.LISPSiteKeys, then
// the map-server on cfg.LISPListen.
func (c *Controller) startLISP(ctx context.Context, cfg DaemonConfig) error {
	var sites []lisp.Site
	if cfg.LISPSiteKeys != "" {
		var err error
		if sites, err = LoadLISPSites(cfg.LISPSiteKeys); err != nil {
			return fmt.Errorf("--lisp-site-keys: %w", err)
		}
	} else {
		c.log.Warn("lisp map-server without --lisp-site-keys: every Map-Register will be refused; mappings come from the API only")
	}
	_, err := c.ServeLISP(ctx, LISPServerConfig{Listen: cfg.LISPListen, Sites: sites})
	return err
}

// lispCollector shows the map-server's counters on /metrics (the figures
// of `onehop lisp server`); nothing when no map-server runs.
type lispCollector struct{ c *Controller }

var (
	descLISPRequests = prometheus.NewDesc("onehop_lisp_map_requests_total",
		"Map-Requests the map-resolver read, by outcome: answered, rate_limited (its source or all sources over the limit), refused (unreadable datagrams on its port).", []string{"outcome"}, nil)
	descLISPNegative = prometheus.NewDesc("onehop_lisp_map_replies_negative_total",
		"Negative records in the Map-Replies sent.", nil, nil)
	descLISPToSource = prometheus.NewDesc("onehop_lisp_map_replies_to_source_total",
		"Map-Replies sent back to the ECM's sender instead of the other address its ITR-RLOC named, being larger than the request.", nil, nil)
	descLISPRegisters = prometheus.NewDesc("onehop_lisp_map_registers_total",
		"Map-Registers, by outcome: accepted, or the reason refused.", []string{"outcome"}, nil)
	descLISPNotifies = prometheus.NewDesc("onehop_lisp_map_notifies_total", "Map-Notifies sent.", nil, nil)
	descLISPExpired  = prometheus.NewDesc("onehop_lisp_registrations_expired_total", "Registrations deleted at expiry.", nil, nil)
)

// Describe implements prometheus.Collector.
func (l lispCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLISPRequests, descLISPNegative, descLISPToSource, descLISPRegisters, descLISPNotifies, descLISPExpired} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (l lispCollector) Collect(ch chan<- prometheus.Metric) {
	st := l.c.LISPServerStats()
	if st.Listen == "" {
		return
	}
	n := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	n(descLISPRequests, st.Requests, "answered")
	n(descLISPRequests, st.RequestsRateLimited, "rate_limited")
	n(descLISPRequests, st.RequestsRefused, "refused")
	n(descLISPNegative, st.NegativeReplies)
	n(descLISPToSource, st.RepliesToSource)
	n(descLISPRegisters, st.Registers, "accepted")
	for reason, v := range st.RegistersRefused {
		n(descLISPRegisters, v, reason)
	}
	n(descLISPNotifies, st.Notifies)
	n(descLISPExpired, st.Expired)
}
