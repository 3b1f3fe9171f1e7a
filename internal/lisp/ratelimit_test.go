package lisp

import (
	"net/netip"
	"testing"
	"time"
)

func TestLimiterBoundsEachAddressAndAllTogether(t *testing.T) {
	l := &Limiter{Rate: 2, Burst: 3, TotalRate: 10, TotalBurst: 5, MaxAddrs: 2}
	now := time.Unix(1000, 0)
	a, b, c := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3")
	allowed := func(addr netip.Addr, n int) int {
		got := 0
		for range n {
			if l.Allow(now, addr) {
				got++
			}
		}
		return got
	}
	if got := allowed(a, 10); got != 3 {
		t.Fatalf("a burst of 10 from one address: %d answered, want its burst of 3", got)
	}
	if got := allowed(b, 10); got != 2 {
		t.Fatalf("then 10 from another: %d answered, want the 2 left of the total's 5", got)
	}
	// Half a second: a's bucket regains one token, the total five.
	now = now.Add(500 * time.Millisecond)
	if got := allowed(a, 10); got != 1 {
		t.Fatalf("after 0.5 s: %d answered from a, want 1 (rate 2/s)", got)
	}
	// A message the total refuses takes nothing from its address.
	l2 := &Limiter{Rate: 100, Burst: 100, TotalRate: 1, TotalBurst: 1}
	l2.Allow(now, a)
	for range 50 {
		l2.Allow(now, b)
	}
	if l2.buckets[b].tokens != 100 {
		t.Fatalf("b's bucket holds %v after refusals by the total, want 100", l2.buckets[b].tokens)
	}
	// Past MaxAddrs, new addresses share one bucket (a and b are not idle).
	if got := allowed(c, 10); got != 3 || len(l.buckets) != 2 {
		t.Fatalf("a third address: %d answered (want the shared bucket's 3), %d addresses followed (want 2)", got, len(l.buckets))
	}
	// Once the followed ones are idle, they are forgotten for a new one.
	now = now.Add(10 * time.Second)
	if !l.Allow(now, netip.MustParseAddr("192.0.2.4")) || len(l.buckets) != 1 {
		t.Fatalf("after 10 s idle: %d addresses followed, want the new one only", len(l.buckets))
	}
}
