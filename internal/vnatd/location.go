package vnatd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/onehop/onehop/internal/backoff"
	"github.com/onehop/onehop/internal/vcmp"
)

// The location client: this endpoint keeps its records at the location
// servers (paper §3.3.2.1; docs/vnat-location.md). Records expire
// (vcmp.RecordLifetime), so an end refreshes, every vcmp.RefreshEvery, the
// record of every connection whose own end is away from its virtual address
// (it moved): a peer that moves later finds it at the server, and the
// controller does not hand the virtual address out while the record lives
// (§3.4.2). A connection that closes or comes home has its record released.

// pushed is what one server was last told about one connection.
type pushed struct {
	phys netip.AddrPort
	at   time.Time
}

// LocationClient keeps this endpoint's records at its location servers.
type LocationClient struct {
	e       *Engine
	servers []netip.Addr
	sent    map[netip.Addr]map[vcmp.Tuple]pushed
	// unreachable: a server that could not be reached is asked again
	// when its serverRetry pause is over, not on every step.
	unreachable map[netip.Addr]*retryAt
}

// retryAt is an unreachable server's schedule and when it is due again.
type retryAt struct {
	retry *backoff.Retry
	at    time.Time
}

// NewLocationClient is the location client of e's endpoint.
func NewLocationClient(e *Engine, servers []netip.Addr) *LocationClient {
	return &LocationClient{e: e, servers: servers, sent: map[netip.Addr]map[vcmp.Tuple]pushed{}, unreachable: map[netip.Addr]*retryAt{}}
}

// needed are the records this endpoint must keep at the servers: every
// connection not aborted whose local end is away from its virtual address.
func (e *Engine) needed() map[vcmp.Tuple]vcmp.Record {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[vcmp.Tuple]vcmp.Record{}
	for t, c := range e.conns {
		if c.m.State != vcmp.Aborted && c.phys.Local.Addr() != t.Local.Addr() {
			out[t] = c.record()
		}
	}
	return out
}

// Step sends each server what changed since the last step: a store for a
// record it does not have (or has elsewhere) or whose refresh is due, a
// release for one no longer needed; one batch per server. It returns how
// many records the servers stored.
func (l *LocationClient) Step(ctx context.Context) (int, error) {
	now := l.e.cfg.Now()
	need := l.e.needed()
	stored := 0
	var errs []error
	for _, srv := range l.servers {
		if u, ok := l.unreachable[srv]; ok && now.Before(u.at) {
			continue
		}
		sent := l.sent[srv]
		if sent == nil {
			sent = map[vcmp.Tuple]pushed{}
			l.sent[srv] = sent
		}
		var msgs []vcmp.Message
		var conns []vcmp.Tuple
		for t, r := range need {
			if p, ok := sent[t]; ok && p.phys == r.Phys && now.Sub(p.at) < vcmp.RefreshEvery {
				continue
			}
			msgs = append(msgs, &vcmp.LocStore{Record: r})
			conns = append(conns, t)
		}
		for t := range sent {
			if _, ok := need[t]; !ok {
				msgs = append(msgs, vcmp.Release(t))
				conns = append(conns, t)
			}
		}
		if len(msgs) == 0 {
			continue
		}
		ans, err := l.e.exchange(ctx, srv, msgs)
		if err != nil {
			u := l.unreachable[srv]
			if u == nil {
				u = &retryAt{retry: serverRetry.Start(now)}
				l.unreachable[srv] = u
			}
			pause, _ := u.retry.Next(now) // serverRetry is never spent
			u.at = now.Add(pause)
			errs = append(errs, fmt.Errorf("vnatd: location server %s: %w", srv, err))
			continue
		}
		delete(l.unreachable, srv)
		l.e.mu.Lock()
		for i, t := range conns {
			a, _ := ans[i].(*vcmp.LocAnswer)
			st, isStore := msgs[i].(*vcmp.LocStore)
			release := isStore && vcmp.IsRelease(st)
			switch {
			case a != nil && release && a.Status != vcmp.LocRefused:
				delete(sent, t)
				l.e.counters["locations_released"]++
			case release:
				// Refused: the record was written from where this end was
				// before (it moved again); it expires on its own.
				delete(sent, t)
			case a != nil && a.Status == vcmp.LocStored:
				sent[t] = pushed{phys: st.Phys, at: now}
				l.e.counters["locations_stored"]++
				stored++
			default:
				// Refused (another source holds the record until it
				// expires, or a limit): asked again at the next refresh.
				sent[t] = pushed{phys: st.Phys, at: now}
				l.e.warn("location_refused", "vnat: location server refused a record", "server", srv, "conn", t, "phys", st.Phys)
			}
		}
		l.e.mu.Unlock()
	}
	return stored, errors.Join(errs...)
}

// LocationStepEvery is how often the client looks for records to store,
// refresh or release: a record is at the servers within a second of the
// move that made it needed.
const LocationStepEvery = time.Second

// keepLocations runs the location client until ctx ends.
func keepLocations(ctx context.Context, e *Engine, servers []netip.Addr, log *slog.Logger) {
	if len(servers) == 0 {
		return
	}
	l := NewLocationClient(e, servers)
	t := time.NewTicker(LocationStepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if _, err := l.Step(sctx); err != nil {
			log.Debug("vnat: location servers", "err", err)
		}
		cancel()
	}
}
