package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Locator is one RLOC of a mapping record (RFC 9301 §5.4).
type Locator struct {
	Addr netip.Addr `json:"addr"`
	// Priority: lower is preferred; 255 means the locator must not be used.
	Priority uint8 `json:"priority"`
	// Weight splits traffic between locators of equal priority.
	Weight uint8 `json:"weight"`
}

// Unusable is the priority that marks a locator as not to be used.
const Unusable = 255

// Record is the mapping system's answer for one EID.
type Record struct {
	EID netip.Prefix  `json:"eid"`
	TTL time.Duration `json:"ttl"`
	// Negative: the EID is not in the mapping system (a negative
	// Map-Reply); its traffic is forwarded natively.
	Negative bool      `json:"negative,omitempty"`
	Locators []Locator `json:"locators,omitempty"`
}

// Resolver answers where an EID lives. The LISP map-resolver client
// (internal/lisp) and the static table below both satisfy it.
type Resolver interface {
	Resolve(ctx context.Context, eid netip.Addr) (Record, error)
}

// ErrNoMapping is returned by a Resolver that knows no mapping for an EID
// (treated like a negative reply).
var ErrNoMapping = errors.New("no mapping")

// StaticResolver answers from mappings given on the command line, longest
// prefix first; an address none covers gets a negative record.
type StaticResolver []Record

// Resolve implements Resolver.
func (s StaticResolver) Resolve(_ context.Context, eid netip.Addr) (Record, error) {
	best := -1
	for i, r := range s {
		if r.EID.Contains(eid) && (best < 0 || r.EID.Bits() > s[best].EID.Bits()) {
			best = i
		}
	}
	if best < 0 {
		return Record{EID: netip.PrefixFrom(eid, eid.BitLen()), Negative: true}, nil
	}
	return s[best], nil
}

// Chain asks each resolver in turn and returns the first positive answer;
// when all are negative it returns the last negative one.
type Chain []Resolver

// Resolve implements Resolver.
func (c Chain) Resolve(ctx context.Context, eid netip.Addr) (Record, error) {
	var last Record
	var errs []error
	answered := false
	for _, r := range c {
		rec, err := r.Resolve(ctx, eid)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !rec.Negative {
			return rec, nil
		}
		last, answered = rec, true
	}
	if answered {
		return last, nil
	}
	return Record{}, errors.Join(errs...)
}

// Mode is how one intercepted connection was carried on.
type Mode string

// The modes a connection can be in.
const (
	// ModeMPTCP: re-opened as MPTCP from the gateway's EIDs, one subflow
	// per usable RLOC.
	ModeMPTCP Mode = "mptcp"
	// ModeTCPFallback: the server did not speak MPTCP; plain TCP over the
	// best RLOC's path.
	ModeTCPFallback Mode = "tcp-fallback"
	// ModeNative: no mapping (negative reply), no usable RLOC or a
	// resolver failure: plain TCP by the gateway's ordinary routes.
	ModeNative Mode = "native"
)

// Subflow is one planned subflow: which path carries it and towards which
// RLOC.
type Subflow struct {
	Path    int     `json:"path"`
	Locator Locator `json:"locator"`
}

// Plan is what the gateway will do with a connection to one destination.
type Plan struct {
	Mode Mode
	// Why says why a connection is native (empty for MPTCP).
	Why string
	// Subflows, best first: the first is the initial subflow (and the
	// only one if the server falls back to TCP). At most one per path.
	Subflows []Subflow
}

// PathFinder says which path reaches an RLOC (its route's interface), or
// false when none does now (the path is down or the RLOC is elsewhere).
type PathFinder func(rloc netip.Addr) (path int, ok bool)

// PlanFor decides a connection's subflows from the destination's record:
// usable locators (priority < 255) ordered by priority, then weight
// (heavier first), then address; each matched to the path that reaches
// it; at most one subflow per path (a path's EID is pinned to one RLOC)
// and MaxPaths in all.
func PlanFor(rec Record, up func(path int) bool, find PathFinder) Plan {
	if rec.Negative {
		return Plan{Mode: ModeNative, Why: "negative map-reply"}
	}
	locs := slices.Clone(rec.Locators)
	slices.SortStableFunc(locs, func(a, b Locator) int {
		if c := cmp.Compare(a.Priority, b.Priority); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Weight, a.Weight); c != 0 {
			return c
		}
		return a.Addr.Compare(b.Addr)
	})
	var p Plan
	used := map[int]bool{}
	unusable := 0
	for _, l := range locs {
		if l.Priority == Unusable {
			unusable++
			continue
		}
		path, ok := find(l.Addr)
		if !ok || used[path] || (up != nil && !up(path)) {
			continue
		}
		used[path] = true
		p.Subflows = append(p.Subflows, Subflow{Path: path, Locator: l})
		if len(p.Subflows) == MaxPaths {
			break
		}
	}
	if len(p.Subflows) == 0 {
		why := "no locator reachable over a path that is up"
		if unusable == len(locs) {
			why = fmt.Sprintf("no usable locator (%d with priority 255)", unusable)
		}
		return Plan{Mode: ModeNative, Why: why}
	}
	p.Mode = ModeMPTCP
	return p
}
