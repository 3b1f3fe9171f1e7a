package vnatd

import (
	"net/netip"
	"time"
)

// Updates are limited per source address (issue 20: a VM spraying unkeyed
// VNAT_UPD over the whole ephemeral port range took a connection over in
// 0.2 s). Two token buckets per source:
//
//   - misses: every update a source sends for a connection it does not own
//     (unknown here, from elsewhere than the peer, forged, unkeyed where
//     keys are required) takes a token; a source out of them is throttled:
//     each update it sends is refused unread until the bucket refills, so a
//     spray costs the daemon a map lookup per message and stops telling
//     the sprayer which tuples exist here (unknown or refused);
//   - unkeyed: each unkeyed update accepted from a source takes a token
//     (--allow-unkeyed; keyed updates are not limited: a tag proves the
//     sender is the peer, and a mover restores many connections at once).

// Per-source update limits.
const (
	// MissBurst updates for connections a source does not own are
	// refused one by one, the first MissBurst at once; past them the
	// source is throttled.
	MissBurst = 256
	// MissPerSecond is how fast a throttled source's budget comes back.
	MissPerSecond = 16
	// UnkeyedBurst unkeyed updates are accepted at once from one source,
	// then UnkeyedPerSecond (--allow-unkeyed).
	UnkeyedBurst     = 64
	UnkeyedPerSecond = 8
	// maxSources bounds the sources tracked per bucket kind; past it,
	// sources new to the daemon share one budget.
	maxSources = 4096
)

// perSource is one kind of token bucket per source address.
type perSource struct {
	rate, burst float64
	now         func() time.Time
	m           map[netip.Addr]*tokens
}

type tokens struct {
	left float64
	at   time.Time
}

func newPerSource(rate, burst float64, now func() time.Time) *perSource {
	return &perSource{rate: rate, burst: burst, now: now, m: map[netip.Addr]*tokens{}}
}

// refill is src's bucket, topped up to now.
func (p *perSource) refill(src netip.Addr) *tokens {
	now := p.now()
	b := p.m[src]
	if b == nil {
		if len(p.m) >= maxSources {
			p.forgetFull(now)
		}
		if len(p.m) >= maxSources {
			src = netip.Addr{} // the overflow budget
			b = p.m[src]
		}
		if b == nil {
			b = &tokens{left: p.burst, at: now}
			p.m[src] = b
		}
	}
	b.left = min(p.burst, b.left+now.Sub(b.at).Seconds()*p.rate)
	b.at = now
	return b
}

// take takes one token from src's bucket: false when it has none.
func (p *perSource) take(src netip.Addr) bool {
	b := p.refill(src)
	if b.left < 1 {
		return false
	}
	b.left--
	return true
}

// empty reports whether src has no token left, taking none.
func (p *perSource) empty(src netip.Addr) bool {
	if _, ok := p.m[src]; !ok && len(p.m) < maxSources {
		return false
	}
	return p.refill(src).left < 1
}

// forgetFull drops the sources whose buckets refilled: they are as if new.
func (p *perSource) forgetFull(now time.Time) {
	for a, b := range p.m {
		if b.left+now.Sub(b.at).Seconds()*p.rate >= p.burst {
			delete(p.m, a)
		}
	}
}
