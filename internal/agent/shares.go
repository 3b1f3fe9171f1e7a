package agent

import (
	"github.com/onehop/onehop/internal/intent"
	"sort"
	"sync"
	"time"
)

// What a VM may cost the agent's slow path, per VM: a VM that floods DHCP
// gets its own few answers per second and no more, so the slow path has
// time for every other VM's requests. The datapath bounds what reaches the
// agent per VM the same way (bpf: vm_share); this is the agent's half.
const (
	// DHCPPerSecond is how many DHCP requests of one VM the agent answers
	// per second, after a burst of DHCPBurst (a booting client sends a
	// handful: discover, request, maybe a retry).
	DHCPPerSecond = 4
	DHCPBurst     = 8
)

// Shares holds a token bucket per VM and kind of slow-path work, and counts
// what each VM was refused.
type Shares struct {
	rate  float64
	burst float64
	now   func() time.Time

	mu      sync.Mutex
	buckets map[shareKey]*tokens
	refused map[shareKey]uint64
}

type shareKey struct{ vm, what string }

type tokens struct {
	left float64
	at   time.Time
}

// NewShares returns buckets of rate per second after a burst; now is the
// clock (time.Now outside tests).
func NewShares(rate, burst float64, now func() time.Time) *Shares {
	if now == nil {
		now = time.Now
	}
	return &Shares{rate: rate, burst: burst, now: now, buckets: map[shareKey]*tokens{}, refused: map[shareKey]uint64{}}
}

// Allow takes one unit of vm's share of what; false means refused (and
// counted).
func (s *Shares) Allow(vm, what string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := shareKey{vm, what}
	now := s.now()
	b := s.buckets[k]
	if b == nil {
		b = &tokens{left: s.burst, at: now}
		s.buckets[k] = b
	}
	b.left += now.Sub(b.at).Seconds() * s.rate
	if b.left > s.burst {
		b.left = s.burst
	}
	b.at = now
	if b.left < 1 {
		s.refused[k]++
		return false
	}
	b.left--
	return true
}

// Forget drops vm's buckets (it left the host); its refusal counts stay,
// as counters do.
func (s *Shares) Forget(vm string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.buckets {
		if k.vm == vm {
			delete(s.buckets, k)
		}
	}
}

// Refused lists every non-zero refusal count, sorted by VM then kind.
func (s *Shares) Refused() []intent.VMRefusal {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]intent.VMRefusal, 0, len(s.refused))
	for k, n := range s.refused {
		out = append(out, intent.VMRefusal{VM: k.vm, What: k.what, Count: n})
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].VM < out[j].VM || (out[i].VM == out[j].VM && out[i].What < out[j].What)
	})
	return out
}
