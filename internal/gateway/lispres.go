package gateway

import (
	"context"
	"net/netip"

	"github.com/onehop/onehop/internal/lisp"
)

// LISPResolver asks a LISP map-resolver (Map-Request / Map-Reply on UDP
// 4342, cached for the record's TTL, nonce checked: internal/lisp) and
// turns its record into the gateway's.
type LISPResolver struct {
	R *lisp.Resolver
}

// NewLISPResolver returns a resolver asking the map-resolver at server.
func NewLISPResolver(server netip.AddrPort) LISPResolver {
	return LISPResolver{R: lisp.NewResolver(server)}
}

// Resolve implements Resolver.
func (l LISPResolver) Resolve(ctx context.Context, eid netip.Addr) (Record, error) {
	rec, err := l.R.Resolve(ctx, eid)
	if err != nil {
		return Record{}, err
	}
	return FromLISP(rec), nil
}

// FromLISP converts a LISP mapping record; one without locators is
// negative whatever its action (the gateway forwards it natively).
func FromLISP(rec lisp.Record) Record {
	out := Record{EID: rec.EID, TTL: rec.TTL, Negative: rec.Negative()}
	for _, l := range rec.Locators {
		out.Locators = append(out.Locators, Locator{Addr: l.Addr, Priority: l.Priority, Weight: l.Weight})
	}
	return out
}
