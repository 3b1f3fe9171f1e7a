package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lisp"
	"github.com/onehop/onehop/internal/store"
)

// DefaultLISPTTLMinutes is the record TTL of a mapping added without one:
// a day, the value RFC 9301's examples use.
const DefaultLISPTTLMinutes = 1440

// The sources of a mapping.
const (
	LISPSourceAPI      = "api"      // added by an operator (REST API or CLI); kept until deleted
	LISPSourceRegister = "register" // registered by an xTR with an authenticated Map-Register; expires
)

// LISPLocator is one RLOC of a mapping.
type LISPLocator struct {
	Addr      string `json:"addr"`
	Priority  uint8  `json:"priority"` // 255 = unusable for unicast
	Weight    uint8  `json:"weight"`
	MPriority uint8  `json:"mPriority"`
	MWeight   uint8  `json:"mWeight"`
	Reachable bool   `json:"reachable"`
}

// LISPMapping is an EID-to-RLOC mapping the map-server holds, as stored in
// etcd and answered by the API. One with no locators is a negative mapping:
// Action says what ITRs do with the EID's packets.
type LISPMapping struct {
	EID           string        `json:"eid"`
	TTLMinutes    uint32        `json:"ttlMinutes"`
	Action        string        `json:"action"`
	Authoritative bool          `json:"authoritative"`
	Locators      []LISPLocator `json:"locators"`
	Source        string        `json:"source"`
	Site          string        `json:"site,omitempty"`      // the site that registered it
	Expires       time.Time     `json:"expires,omitzero"`    // when a registration not refreshed is dropped
	Updated       time.Time     `json:"updated,omitzero"`    // last write (registrations: last refresh)
	MapVersion    uint16        `json:"mapVersion,omitzero"` // from the registration, 0 otherwise
}

// Record is the mapping as the LISP codec carries it.
func (m LISPMapping) Record() (lisp.Record, error) {
	p, err := netip.ParsePrefix(m.EID)
	if err != nil {
		return lisp.Record{}, fmt.Errorf("mapping %q: %w", m.EID, err)
	}
	act, err := lisp.ParseAction(m.Action)
	if err != nil {
		return lisp.Record{}, fmt.Errorf("mapping %s: %w", m.EID, err)
	}
	r := lisp.Record{EID: p, TTL: time.Duration(m.TTLMinutes) * time.Minute, Action: act, Authoritative: m.Authoritative, MapVersion: m.MapVersion}
	for _, l := range m.Locators {
		a, err := netip.ParseAddr(l.Addr)
		if err != nil {
			return lisp.Record{}, fmt.Errorf("mapping %s: locator %q: %w", m.EID, l.Addr, err)
		}
		r.Locators = append(r.Locators, lisp.Locator{Addr: a, Priority: l.Priority, Weight: l.Weight,
			MPriority: l.MPriority, MWeight: l.MWeight, Reachable: l.Reachable})
	}
	return r, nil
}

// live reports whether the map-server answers with m at now.
func (m LISPMapping) live(now time.Time) bool {
	return m.Source != LISPSourceRegister || now.Before(m.Expires)
}

// mappingOfRecord is a registered record as stored.
func mappingOfRecord(r lisp.Record, site string, now, expires time.Time) LISPMapping {
	m := LISPMapping{EID: r.EID.String(), TTLMinutes: uint32(r.TTL / time.Minute), Action: r.Action.String(),
		Authoritative: r.Authoritative, Locators: []LISPLocator{}, Source: LISPSourceRegister, Site: site,
		Expires: expires.UTC(), Updated: now.UTC(), MapVersion: r.MapVersion}
	for _, l := range r.Locators {
		m.Locators = append(m.Locators, LISPLocator{Addr: l.Addr.String(), Priority: l.Priority, Weight: l.Weight,
			MPriority: l.MPriority, MWeight: l.MWeight, Reachable: l.Reachable})
	}
	return m
}

// LISPLocatorBody is one locator of a POST body; fields left out take
// their defaults (priority 1, weight 100, mPriority 255, mWeight 0).
type LISPLocatorBody struct {
	Addr      string `json:"addr"`
	Priority  *int   `json:"priority,omitempty"`
	Weight    *int   `json:"weight,omitempty"`
	MPriority *int   `json:"mPriority,omitempty"`
	MWeight   *int   `json:"mWeight,omitempty"`
}

// LISPMappingBody is what POST /v1/lisp/mappings reads.
type LISPMappingBody struct {
	EID        string            `json:"eid"`
	TTLMinutes *int64            `json:"ttlMinutes,omitempty"` // default DefaultLISPTTLMinutes
	Action     string            `json:"action,omitempty"`     // default no-action, or native-forward without locators
	Locators   []LISPLocatorBody `json:"locators"`
}

// mapping checks the body and names the field it refuses.
func (b LISPMappingBody) mapping(now time.Time) (LISPMapping, netip.Prefix, error) {
	p, err := netip.ParsePrefix(b.EID)
	if err != nil {
		return LISPMapping{}, p, fieldErr("eid", fmt.Errorf("%q: want an EID prefix such as 10.99.0.0/16", b.EID))
	}
	if p.Masked() != p {
		return LISPMapping{}, p, fieldErr("eid", fmt.Errorf("%s has host bits set: want %s", p, p.Masked()))
	}
	m := LISPMapping{EID: p.String(), TTLMinutes: DefaultLISPTTLMinutes, Authoritative: true, Locators: []LISPLocator{},
		Source: LISPSourceAPI, Updated: now.UTC()}
	if b.TTLMinutes != nil {
		if *b.TTLMinutes < 0 || *b.TTLMinutes > 0xffffffff {
			return m, p, fieldErr("ttlMinutes", fmt.Errorf("%d: want 0 to 4294967295 minutes", *b.TTLMinutes))
		}
		m.TTLMinutes = uint32(*b.TTLMinutes)
	}
	if len(b.Locators) > 255 {
		return m, p, fieldErr("locators", fmt.Errorf("%d locators: a record holds at most 255", len(b.Locators)))
	}
	seen := map[netip.Addr]int{}
	for i, l := range b.Locators {
		field := fmt.Sprintf("locators[%d]", i)
		a, err := netip.ParseAddr(l.Addr)
		if err != nil || a.Zone() != "" || a.Is4In6() {
			return m, p, fieldErr(field+".addr", fmt.Errorf("%q: want an IPv4 or IPv6 address", l.Addr))
		}
		if j, dup := seen[a]; dup {
			return m, p, fieldErr(field+".addr", fmt.Errorf("%s is already locators[%d]", a, j))
		}
		seen[a] = i
		loc := LISPLocator{Addr: a.String(), Priority: 1, Weight: 100, MPriority: 255, Reachable: true}
		for _, f := range []struct {
			name string
			v    *int
			dst  *uint8
		}{{"priority", l.Priority, &loc.Priority}, {"weight", l.Weight, &loc.Weight}, {"mPriority", l.MPriority, &loc.MPriority}, {"mWeight", l.MWeight, &loc.MWeight}} {
			if f.v == nil {
				continue
			}
			if *f.v < 0 || *f.v > 255 {
				return m, p, fieldErr(field+"."+f.name, fmt.Errorf("%d: want 0 to 255", *f.v))
			}
			*f.dst = uint8(*f.v)
		}
		m.Locators = append(m.Locators, loc)
	}
	act := lisp.ActionNoAction
	if len(m.Locators) == 0 {
		act = lisp.ActionNativelyForward
	}
	if b.Action != "" {
		if act, err = lisp.ParseAction(strings.ToLower(b.Action)); err != nil {
			return m, p, fieldErr("action", err)
		}
	}
	m.Action = act.String()
	return m, p, nil
}

// lispMu serialises the map-server's writes (API and Map-Registers): read
// what is there, decide, write.
var lispMu sync.Mutex

// lispRoutes serves the LISP map-server's mappings (issue 11, docs/cloud-access.md).
func (c *Controller) lispRoutes(mux *router) {
	mux.HandleFunc("GET /v1/lisp/mappings", func(w http.ResponseWriter, r *http.Request) {
		out, err := c.ListLISPMappings(r.Context())
		reply(w, http.StatusOK, out, err)
	})
	mux.HandleFunc("POST /v1/lisp/mappings", func(w http.ResponseWriter, r *http.Request) {
		var in LISPMappingBody
		if decode(w, r, &in) {
			m, err := c.AddLISPMapping(r.Context(), in)
			reply(w, http.StatusCreated, m, err)
		}
	})
	mux.HandleFunc("GET /v1/lisp/mappings/{addr}/{len}", func(w http.ResponseWriter, r *http.Request) {
		p, err := pathPrefix(r)
		var m LISPMapping
		if err == nil {
			m, err = c.GetLISPMapping(r.Context(), p)
		}
		reply(w, http.StatusOK, m, err)
	})
	mux.HandleFunc("DELETE /v1/lisp/mappings/{addr}/{len}", func(w http.ResponseWriter, r *http.Request) {
		p, err := pathPrefix(r)
		if err == nil {
			err = c.DeleteLISPMapping(r.Context(), p)
		}
		reply(w, http.StatusNoContent, nil, err)
	})
	mux.HandleFunc("GET /v1/lisp/server", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, c.LISPServerStats(), nil)
	})
}

func pathPrefix(r *http.Request) (netip.Prefix, error) {
	s := r.PathValue("addr") + "/" + r.PathValue("len")
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return p, fieldErr("eid", fmt.Errorf("%q: want ADDR/LEN, e.g. /v1/lisp/mappings/10.99.0.0/16", s))
	}
	if p.Masked() != p {
		return p, fieldErr("eid", fmt.Errorf("%s has host bits set: want %s", p, p.Masked()))
	}
	return p, nil
}

// ListLISPMappings returns the mappings the map-server answers with, by
// EID; registrations past their expiry are left out.
func (c *Controller) ListLISPMappings(ctx context.Context) ([]LISPMapping, error) {
	all, _, err := store.ListJSON[LISPMapping](ctx, c.store, intent.LISPMappingsPrefix)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := all[:0]
	for _, m := range all {
		if m.live(now) {
			out = append(out, m)
		}
	}
	sortMappings(out)
	return out, nil
}

func sortMappings(ms []LISPMapping) {
	slices.SortFunc(ms, func(a, b LISPMapping) int {
		pa, _ := netip.ParsePrefix(a.EID)
		pb, _ := netip.ParsePrefix(b.EID)
		if c := pa.Addr().Compare(pb.Addr()); c != 0 {
			return c
		}
		return pa.Bits() - pb.Bits()
	})
}

// GetLISPMapping returns the mapping for exactly p.
func (c *Controller) GetLISPMapping(ctx context.Context, p netip.Prefix) (LISPMapping, error) {
	var m LISPMapping
	err := store.GetJSON(ctx, c.store, intent.LISPMappingKey(p), &m)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !m.live(time.Now())) {
		return LISPMapping{}, notFound("eid", "mapping %s", p)
	}
	return m, err
}

// AddLISPMapping stores an operator's mapping. One for an EID prefix that
// has an operator's mapping already is refused (409); one for a prefix an
// xTR registered replaces the registration, and the map-server refuses
// that site's Map-Registers for it from then on.
func (c *Controller) AddLISPMapping(ctx context.Context, b LISPMappingBody) (LISPMapping, error) {
	m, p, err := b.mapping(time.Now())
	if err != nil {
		return LISPMapping{}, err
	}
	lispMu.Lock()
	defer lispMu.Unlock()
	var old LISPMapping
	switch err := store.GetJSON(ctx, c.store, intent.LISPMappingKey(p), &old); {
	case err == nil && old.Source == LISPSourceAPI:
		return LISPMapping{}, conflict("eid", "mapping %s", p)
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return LISPMapping{}, err
	}
	if err := store.PutJSON(ctx, c.store, intent.LISPMappingKey(p), m); err != nil {
		return LISPMapping{}, err
	}
	c.lispChanged(ctx)
	return m, nil
}

// DeleteLISPMapping removes the mapping for exactly p, operator's or
// registered (a site that still registers it comes back at its next
// Map-Register).
func (c *Controller) DeleteLISPMapping(ctx context.Context, p netip.Prefix) error {
	lispMu.Lock()
	defer lispMu.Unlock()
	if _, err := c.store.Get(ctx, intent.LISPMappingKey(p)); errors.Is(err, store.ErrNotFound) {
		return notFound("eid", "mapping %s", p)
	} else if err != nil {
		return err
	}
	if err := c.store.Delete(ctx, intent.LISPMappingKey(p)); err != nil {
		return err
	}
	c.lispChanged(ctx)
	return nil
}
