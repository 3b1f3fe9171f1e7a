package vnatd

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/backoff"
	"github.com/onehop/onehop/internal/vcmp"
)

// Before a move: the suspend claim to each peer (§3.3.1), sent again to a
// peer that does not answer; and key agreement at first contact, so that an
// unplanned move is authenticated too.

// Suspend claims the primary role for the connections sel picks (all when
// nil) before this end moves (§3.3.1): SUSP_PRIMARY and KEY to each peer,
// one batch per peer. It returns how many connections it suspended.
func (e *Engine) Suspend(ctx context.Context, sel func(vcmp.Tuple) bool) (int, error) {
	if err := e.Sync(); err != nil {
		return 0, err
	}
	e.mu.Lock()
	byPeer := map[netip.Addr][]*conn{}
	msgs := map[netip.Addr][]vcmp.Message{}
	n := 0
	for t, c := range e.conns {
		if sel != nil && !sel(t) {
			continue
		}
		acts, err := e.step(c, vcmp.EvSuspend)
		if err != nil || len(acts) == 0 {
			continue // already suspended, or a secondary that now moves too
		}
		if err := c.newKeys(); err != nil {
			e.mu.Unlock()
			return n, err
		}
		n++
		p := c.phys.Remote.Addr()
		byPeer[p] = append(byPeer[p], c)
		msgs[p] = append(msgs[p], &vcmp.SuspPrimary{Record: c.record()}, &vcmp.Key{Record: c.record(), Public: c.own})
	}
	e.saveKeys() // the old keys are gone with the new suspension
	e.mu.Unlock()
	// One claim batch per peer, the peers at once: a peer that does not
	// answer must not hold up the claims to the others.
	var (
		wg   sync.WaitGroup
		emu  sync.Mutex
		errs []error
	)
	for p, cs := range byPeer {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.claim(ctx, p, cs, msgs[p]); err != nil {
				emu.Lock()
				errs = append(errs, err)
				emu.Unlock()
			}
		}()
	}
	wg.Wait()
	return n, errors.Join(errs...)
}

// claim sends one peer its claim batch until it answers or ClaimRetry is
// spent, and steps the connections with the answer. A retransmitted claim
// is the same batch (the same keys): a peer that took the first one but
// whose answer was lost answers again with the same role and key.
func (e *Engine) claim(ctx context.Context, p netip.Addr, cs []*conn, msgs []vcmp.Message) error {
	retry := e.cfg.ClaimRetry.Start(e.cfg.Now())
	var ans []vcmp.Message
	var err error
	for try := 1; ; try++ {
		tctx, cancel := context.WithTimeout(ctx, e.cfg.SuspTimeout)
		ans, err = e.exchange(tctx, p, msgs)
		cancel()
		if err == nil || ctx.Err() != nil {
			break
		}
		pause, ok := retry.Next(e.cfg.Now())
		if !ok {
			break
		}
		e.mu.Lock()
		e.counters["susp_retransmitted"]++
		e.mu.Unlock()
		e.log.Info("vnat: suspend claim unanswered, sending again", "peer", p, "try", try, "pause", pause, "err", err)
		backoff.Sleep(ctx, pause) // an ended ctx ends the loop at the next try
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		e.counters["susp_unanswered"]++
		for _, c := range cs {
			e.step(c, vcmp.EvTimeout) //nolint:errcheck // no answer: primary by default
		}
		return fmt.Errorf("vnatd: suspend with %s: no answer after %d tries, primary by default: %w", p, e.cfg.ClaimRetry.Tries, err)
	}
	for i, c := range cs {
		claim, key := ans[2*i], ans[2*i+1]
		switch claim.(type) {
		case *vcmp.SuspSecondary:
			e.step(c, vcmp.EvRecvSuspSecondary) //nolint:errcheck // only Awaiting changes
		case *vcmp.SuspPrimary:
			if c.m.Awaiting { // crossing: the peer's handler arbitrated too
				e.step(c, vcmp.EvRecvSuspPrimary) //nolint:errcheck
			}
		default:
			e.step(c, vcmp.EvTimeout) //nolint:errcheck // the peer does not know it: primary alone
		}
		if k, ok := key.(*vcmp.Key); ok {
			if err := c.agree(k.Public); err != nil {
				e.warn("refused_key", "vnat: peer key refused", "conn", c.m.Tuple, "err", err)
			}
		}
	}
	e.saveKeys()
	return nil
}

// AgreeKeys agrees update keys at first contact for the connections that
// have none and were never tried (one VCMP_KEY batch per peer), so that an
// unplanned move (no suspend) is authenticated too. A peer without a VNAT
// daemon is not asked again; one whose daemon does not know the connection
// yet is asked again on the next call, up to MaxKeyTries. It returns how many connections got keys.
func (e *Engine) AgreeKeys(ctx context.Context) (int, error) {
	e.mu.Lock()
	byPeer := map[netip.Addr][]*conn{}
	msgs := map[netip.Addr][]vcmp.Message{}
	now := e.cfg.Now()
	for _, c := range e.conns {
		if c.keys != nil || (c.m.State != vcmp.Active && c.m.State != vcmp.Migrated) || !c.askKeys(now) {
			continue
		}
		if err := c.newKeys(); err != nil {
			e.mu.Unlock()
			return 0, err
		}
		p := c.phys.Remote.Addr()
		byPeer[p] = append(byPeer[p], c)
		msgs[p] = append(msgs[p], &vcmp.Key{Record: c.record(), Public: c.own})
	}
	e.mu.Unlock()
	n := 0
	var errs []error
	for p, cs := range byPeer {
		ans, err := e.exchange(ctx, p, msgs[p])
		if err != nil {
			// No daemon there (or not reachable): not asked again.
			e.mu.Lock()
			for _, c := range cs {
				c.keyRetry.Stop()
			}
			e.mu.Unlock()
			errs = append(errs, fmt.Errorf("vnatd: keys with %s: %w", p, err))
			continue
		}
		e.mu.Lock()
		for i, c := range cs {
			if r, ok := ans[i].(*vcmp.UpdateReply); ok && r.Status == vcmp.UpdateUnknown {
				continue // the peer has not seen the connection yet: asked again next time
			}
			if k, ok := ans[i].(*vcmp.Key); ok && c.keys == nil {
				if err := c.agree(k.Public); err == nil {
					n++
				}
			} else if ok {
				n++ // the peer's own first contact crossed ours and agreed already
			}
		}
		e.saveKeys()
		e.mu.Unlock()
	}
	return n, errors.Join(errs...)
}

// askKeys says whether AgreeKeys asks c's peer for keys this round, and
// counts the try: keyRetry's tries, one a round. Called with e.mu held.
func (c *conn) askKeys(now time.Time) bool {
	if c.keyRetry == nil {
		c.keyRetry = keyRetry.Start(now)
		return true
	}
	_, ok := c.keyRetry.Next(now) // the last round's try got no keys
	return ok
}
