package lisp

import (
	"net/netip"
	"sync"
	"time"
)

// Limiter rate-limits the answers a LISP control-plane responder gives to
// messages anyone can send unauthenticated (Map-Requests, RLOC probes;
// RFC 9301 §5.3 and §7.1 ask for it): a token bucket per address and one
// for all addresses together. Pure: the caller passes the clock's time.
// Safe for concurrent use.
type Limiter struct {
	// Rate and Burst are each address's answers a second and at once.
	Rate, Burst float64
	// TotalRate and TotalBurst are all addresses' together.
	TotalRate, TotalBurst float64
	// MaxAddrs bounds the addresses followed (DefaultLimiterAddrs if 0);
	// when full, a new address shares one bucket with every other
	// untracked one, so a sender cycling addresses cannot grow the table.
	MaxAddrs int

	mu      sync.Mutex
	buckets map[netip.Addr]*bucket
	other   bucket
	total   bucket
}

// DefaultLimiterAddrs is Limiter's MaxAddrs when not set.
const DefaultLimiterAddrs = 4096

type bucket struct {
	tokens float64
	at     time.Time
}

// fill brings b up to date at now (rate a second up to burst; a bucket
// never used starts full) and reports whether it holds a token.
func (b *bucket) fill(now time.Time, rate, burst float64) bool {
	if b.at.IsZero() {
		b.tokens = burst
	} else {
		b.tokens = min(burst, b.tokens+now.Sub(b.at).Seconds()*rate)
	}
	b.at = now
	return b.tokens >= 1
}

// Allow reports whether an answer to a message from a may go out at now:
// a's bucket and the total must both hold a token, and only then is one
// taken from each (a message refused by the total takes nothing from a).
func (l *Limiter) Allow(now time.Time, a netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buckets == nil {
		l.buckets = map[netip.Addr]*bucket{}
	}
	b := l.bucketOf(now, a.Unmap())
	if !b.fill(now, l.Rate, l.Burst) || !l.total.fill(now, l.TotalRate, l.TotalBurst) {
		return false
	}
	b.tokens--
	l.total.tokens--
	return true
}

// bucketOf returns a's bucket, forgetting idle addresses when the table is
// full (a full bucket is what a new one starts with, so nothing is lost).
func (l *Limiter) bucketOf(now time.Time, a netip.Addr) *bucket {
	if b := l.buckets[a]; b != nil {
		return b
	}
	limit := l.MaxAddrs
	if limit <= 0 {
		limit = DefaultLimiterAddrs
	}
	if len(l.buckets) >= limit && l.Rate > 0 {
		idle := time.Duration(l.Burst / l.Rate * float64(time.Second))
		for k, b := range l.buckets {
			if now.Sub(b.at) > idle {
				delete(l.buckets, k)
			}
		}
	}
	if len(l.buckets) >= limit {
		return &l.other
	}
	b := &bucket{}
	l.buckets[a] = b
	return b
}
