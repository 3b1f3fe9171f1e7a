package xtr

import (
	"net/netip"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/lisp"
)

// Rate limits of the RLOC-probe answers (RFC 9301 §7.1). A probe is
// unauthenticated, so a forged source could aim the answers at someone
// else: each source address gets ProbeBurst answers at once and then
// ProbeRate a second, and all sources together ProbeTotalRate a second; an
// answer is never larger than lisp.MaxProbeReplyLen (so at most ~5 KB/s
// to one address, ~256 KB/s in all). A gateway probing at its fastest
// (every 100 ms) stays under ProbeRate for two locators per source.
const (
	ProbeRate      = 20
	ProbeBurst     = 40
	ProbeTotalRate = 1000
	// MaxProbeSources bounds the sources followed; when full, a new source
	// shares one bucket with every other untracked one.
	MaxProbeSources = 4096
)

// ProbeStats counts what the probe responder did.
type ProbeStats struct {
	Answered    uint64 `json:"answered"`
	RateLimited uint64 `json:"rate_limited"`
	Refused     uint64 `json:"refused"` // not a probe, not decodable, an EID not served, too large
}

// Responder answers RLOC probes for the EIDs the xTR serves (pure: the
// caller reads and sends the datagrams).
type Responder struct {
	served []lisp.Record
	now    func() time.Time
	limit  *lisp.Limiter

	mu    sync.Mutex
	stats ProbeStats
}

// NewResponder answers for the records served; now is the clock (nil:
// time.Now).
func NewResponder(served []lisp.Record, now func() time.Time) *Responder {
	if now == nil {
		now = time.Now
	}
	return &Responder{served: served, now: now, limit: &lisp.Limiter{Rate: ProbeRate, Burst: ProbeBurst,
		TotalRate: ProbeTotalRate, TotalBurst: ProbeTotalRate, MaxAddrs: MaxProbeSources}}
}

// Stats returns the counters.
func (r *Responder) Stats() ProbeStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Answer returns the reply to the datagram msg that arrived from src on the
// xTR's locator local, or nil when none is due (the reason counted). The
// reply goes back to src itself, not to the ITR-RLOCs the probe names: a
// probe cannot aim an answer at a third address.
func (r *Responder) Answer(msg []byte, src netip.AddrPort, local netip.Addr) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, err := lisp.MessageType(msg); err != nil || t != lisp.TypeMapRequest {
		r.stats.Refused++
		return nil
	}
	req, err := lisp.DecodeMapRequest(msg)
	if err != nil || !req.Probe {
		r.stats.Refused++
		return nil
	}
	if !r.limit.Allow(r.now(), src.Addr()) {
		r.stats.RateLimited++
		return nil
	}
	out, err := lisp.AnswerProbe(req, r.served, local)
	if err != nil {
		r.stats.Refused++
		return nil
	}
	r.stats.Answered++
	return out
}
