package vnatd

import (
	"testing"
	"time"

	"github.com/onehop/onehop/internal/backoff"
	"github.com/onehop/onehop/internal/vcmp"
)

// A claim whose first tries are lost (dials dropped, or the peer's answer
// lost after it took the claim) is sent again with a doubling pause; the
// peer still ends secondary, the keys agree, and the migration after the
// move is keyed.
func TestSuspendClaimIsRetransmittedUntilAnswered(t *testing.T) {
	for _, how := range []string{"dials dropped", "answers lost"} {
		t.Run(how, func(t *testing.T) {
			n := newNetwork()
			const retry = 20 * time.Millisecond
			a := n.add(t, "a", "10.0.1.1", Config{ClaimRetry: backoff.Backoff{Initial: retry}})
			b := n.add(t, "b", "10.0.2.2", Config{})
			ta, tb := connect(a, b, 40000)
			syncAll(t, a, b)
			if how == "dials dropped" {
				n.drop[b.addr] = 2
			} else {
				n.lose[b.addr] = 2
			}
			k, err := a.e.Suspend(t.Context(), nil)
			if err != nil || k != 1 {
				t.Fatalf("suspend: %d, %v; want 1 and no error", k, err)
			}
			if got := n.dials[b.addr]; got != 3 {
				t.Errorf("a sent its claim %d times, want 3 (two lost)", got)
			}
			ts := n.dialed[b.addr]
			for i := 1; i < len(ts); i++ {
				if gap, least := ts[i].Sub(ts[i-1]), retry<<(i-1); gap < least {
					t.Errorf("try %d came %v after the one before, want at least %v (doubling pause)", i+1, gap, least)
				}
			}
			sa, sb := state(t, a, ta), state(t, b, tb)
			if sa.Role != "primary" || sb.Role != "secondary" || !sa.Keyed || !sb.Keyed {
				t.Fatalf("after the retransmitted claim: a %+v, b %+v; want a primary, b secondary, both keyed", sa, sb)
			}
			if a.e.conns[ta].m.Awaiting {
				t.Error("a still awaits an answer it got")
			}
			if c := a.e.Counters(); c["susp_retransmitted"] != 2 || c["susp_unanswered"] != 0 {
				t.Errorf("a counters %v: want 2 retransmissions, none unanswered", c)
			}
			old, new := n.move(a, "10.0.3.3")
			if err := a.e.Restore(t.Context(), old, new); err != nil {
				t.Fatal(err)
			}
			wantPhys(t, a, ta, new, b.addr)
			wantPhys(t, b, tb, b.addr, new)
		})
	}
}

// A peer that never answers gets SuspTries claims; then the connection is
// primary by default (the paper's "no negotiation"), not keyed, and the
// error says so.
func TestSuspendClaimNeverAnsweredFallsBackToPrimary(t *testing.T) {
	n := newNetwork()
	a := n.add(t, "a", "10.0.1.1", Config{ClaimRetry: backoff.Backoff{Initial: time.Millisecond}})
	b := n.add(t, "b", "10.0.2.2", Config{})
	ta, tb := connect(a, b, 40000)
	syncAll(t, a, b)
	n.drop[b.addr] = 100
	k, err := a.e.Suspend(t.Context(), nil)
	if err == nil || k != 1 {
		t.Fatalf("suspend: %d, %v; want 1 and an error saying nobody answered", k, err)
	}
	if got := n.dials[b.addr]; got != SuspTries {
		t.Errorf("a sent its claim %d times, want %d", got, SuspTries)
	}
	c := a.e.conns[ta]
	if c.m.Awaiting || c.m.Role != vcmp.RolePrimary || c.m.State != vcmp.Suspended || c.keys != nil {
		t.Errorf("a's connection %+v keyed %v: want suspended primary, not awaiting, no keys", c.m, c.keys != nil)
	}
	if s := state(t, b, tb); s.State != "active" {
		t.Errorf("b heard nothing and still changed: %+v", s)
	}
	if cs := a.e.Counters(); cs["susp_retransmitted"] != SuspTries-1 || cs["susp_unanswered"] != 1 {
		t.Errorf("a counters %v: want %d retransmissions, 1 unanswered", cs, SuspTries-1)
	}
}
