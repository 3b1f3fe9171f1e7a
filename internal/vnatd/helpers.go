package vnatd

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/vcmp"
)

// Helper is a connection migration helper (paper §3.3.1.3): started for a
// connection whose peer is away (the peer sent VNAT_SUSP_PRIMARY: this end
// is the stationary secondary), stopped when the peer is back (its update
// settled the connection), when the migration is aborted, when the
// connection closes, and when the daemon stops.
type Helper interface {
	// Name names the helper in logs and counters.
	Name() string
	// Start helps the connection (its virtual tuple, from this end).
	Start(virtual vcmp.Tuple) error
	// Stop stops helping it.
	Stop(virtual vcmp.Tuple) error
}

// step applies ev to c's role machine and carries out the helper actions
// it returns. Called with e.mu held.
func (e *Engine) step(c *conn, ev vcmp.Event) ([]vcmp.Action, error) {
	acts, err := c.m.Step(ev)
	if c.m.State != vcmp.Suspended {
		c.awayExpired = false // the wait it was about is over
	}
	for _, a := range acts {
		switch a {
		case vcmp.ActStartHelper:
			e.startHelpers(c)
		case vcmp.ActStopHelper:
			e.stopHelpers(c)
		}
	}
	return acts, err
}

// startHelpers starts every helper for c. A helper that fails is logged
// and counted; the migration goes on without it. Called with e.mu held.
func (e *Engine) startHelpers(c *conn) {
	if c.helping {
		return
	}
	c.helping, c.awaySince, c.awayExpired = true, e.cfg.Now(), false
	e.counters["helpers_started"]++
	for _, h := range e.cfg.Helpers {
		if err := h.Start(c.m.Tuple); err != nil {
			e.warn("helper_errors", "vnat: start helper", "helper", h.Name(), "conn", c.m.Tuple, "err", err)
		}
	}
}

// stopHelpers stops every helper for c. Called with e.mu held.
func (e *Engine) stopHelpers(c *conn) {
	if !c.helping {
		return
	}
	c.helping = false
	e.counters["helpers_stopped"]++
	for _, h := range e.cfg.Helpers {
		if err := h.Stop(c.m.Tuple); err != nil {
			e.warn("helper_errors", "vnat: stop helper", "helper", h.Name(), "conn", c.m.Tuple, "err", err)
		}
	}
}

// ExpireAway stops the helpers of every connection whose peer has been
// away longer than Config.MaxAway (paper §3.3.2.1: "the length of the
// suspension is a policy decision"): a peer that suspended and never came
// back must not keep this end's application frozen and its keepalives
// answered for as long as the connection lives. The application is
// thawed and its own keepalives and timeouts decide; the connection stays
// suspended, so a peer that does come back still settles it. Each is
// counted (away_expired) and logged, rate-limited. It returns how many it
// stopped.
func (e *Engine) ExpireAway() int {
	if e.cfg.MaxAway <= 0 {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.cfg.Now()
	n := 0
	for _, c := range e.conns {
		if !c.helping || now.Sub(c.awaySince) < e.cfg.MaxAway {
			continue
		}
		e.stopHelpers(c)
		c.awayExpired = true
		n++
		e.warn("away_expired", "vnat: peer away longer than --max-away: its helpers stopped (keepalives no longer answered, application thawed), the application's own timeouts decide now",
			"conn", c.m.Tuple, "away", now.Sub(c.awaySince).Round(time.Second), "max_away", e.cfg.MaxAway)
	}
	return n
}

// expireAway runs ExpireAway until ctx ends, often enough that a helper
// stops within a tenth of MaxAway (at most a second) after it expired.
func expireAway(ctx context.Context, e *Engine) {
	if e.cfg.MaxAway <= 0 {
		return
	}
	t := time.NewTicker(min(max(e.cfg.MaxAway/10, 10*time.Millisecond), time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		e.ExpireAway()
	}
}

// StopHelpers stops every running helper: the daemon is stopping, and an
// application must not stay frozen, nor a connection answered for, after it.
func (e *Engine) StopHelpers() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.conns {
		e.stopHelpers(c)
	}
}

// Freezer is the generic helper (paper §3.3.1.3, case 2: "a more generic
// helper ... that essentially blocks the corresponding process"): it
// freezes the local application's cgroup while the peer of any of its
// connections is away, and thaws it when the last one is back. A frozen
// application sends nothing its peer could miss.
type Freezer struct {
	// Set freezes (true) or thaws (false) the cgroup.
	Set func(frozen bool) error

	mu   sync.Mutex
	away map[vcmp.Tuple]bool
}

// Name is "cgroup-freeze".
func (f *Freezer) Name() string { return "cgroup-freeze" }

// Start freezes the cgroup when v is the first connection whose peer is away.
func (f *Freezer) Start(v vcmp.Tuple) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.away == nil {
		f.away = map[vcmp.Tuple]bool{}
	}
	if f.away[v] {
		return nil
	}
	f.away[v] = true
	if len(f.away) == 1 {
		if err := f.Set(true); err != nil {
			delete(f.away, v)
			return fmt.Errorf("freeze: %w", err)
		}
	}
	return nil
}

// Stop thaws the cgroup when v was the last connection whose peer is away.
func (f *Freezer) Stop(v vcmp.Tuple) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.away[v] {
		return nil
	}
	delete(f.away, v)
	if len(f.away) == 0 {
		if err := f.Set(false); err != nil {
			return fmt.Errorf("thaw: %w", err)
		}
	}
	return nil
}
