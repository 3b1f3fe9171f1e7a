package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/onehop/onehop/internal/intent"
)

// Authorization: every route the API serves has a scope, which says who may
// call it (docs/tenants.md has the table). It is decided once, here, for
// every request, before the handler runs; the handler of a list answers a
// tenant only its own farm's objects.
//
// A route whose path has {farm} is scoped to that farm by itself: a tenant
// may call it on its own farm only (403 otherwise). Any other route needs
// its line in routeScopes: router.Handle refuses to register one without
// (and TestEveryRouteHasAScope walks the routes and the OpenAPI paths).

// scope says who may call a route.
type scope int

const (
	// scopeFarm: the {farm} of the path must be the caller's (admins: any).
	scopeFarm scope = iota + 1
	// scopeAdmin: cloud-wide operations (hosts, slivers, LISP, the store,
	// the agents' status, tenant tokens, creating a farm): admins only.
	scopeAdmin
	// scopeOwnFarm: lists of a noun that belongs to farms; a tenant is
	// answered its own farm's (the handler filters by IdentityOf).
	scopeOwnFarm
	// scopeRead: cloud-wide facts a tenant needs to use its farm (the
	// hosts it may place VMs on); read-only for everyone.
	scopeRead
	// scopeTap: TAP policies, which name VMs rather than a farm in their
	// path: the handler authorizes by the farms the policy names
	// (authorizeTap).
	scopeTap
	// scopeAny: not an operation (the JSON 404 of an unknown path).
	scopeAny
	// scopeTrace: `onehop trace`, whose VMs are named in its query: the
	// handler authorizes FROM's and TO's farms (Trace).
	scopeTrace
)

func (s scope) String() string {
	return [...]string{"", "farm", "admin", "own-farm", "read", "tap", "any", "trace"}[s]
}

// routeScopes are the scopes of routes whose path has no {farm}, and of
// those that have one but are not the tenant's to call.
var routeScopes = map[string]scope{
	"/":                                     scopeAny,
	"GET /metrics":                          scopeAdmin,
	"GET /v1/farms":                         scopeOwnFarm,
	"POST /v1/farms":                        scopeAdmin, // a farm and its tenant's credentials are the operator's to make
	"DELETE /v1/farms/{farm}":               scopeAdmin, // as its creation; its tenant's tokens outlive it (docs/tenants.md)
	"GET /v1/subnets":                       scopeOwnFarm,
	"GET /v1/vms":                           scopeOwnFarm,
	"GET /v1/rules":                         scopeOwnFarm,
	"GET /v1/audit":                         scopeOwnFarm,
	"GET /v1/trace":                         scopeTrace,
	"GET /v1/hosts":                         scopeRead,
	"POST /v1/hosts":                        scopeAdmin,
	"GET /v1/hosts/{host}":                  scopeAdmin, // lists the VMs of every farm on the host
	"DELETE /v1/hosts/{host}":               scopeAdmin,
	"GET /v1/status":                        scopeAdmin,
	"GET /v1/store":                         scopeAdmin,
	"GET /v1/version":                       scopeRead, // which onehop the controller runs: no secret, every client may compare
	"GET /v1/slivers":                       scopeAdmin,
	"POST /v1/slivers":                      scopeAdmin,
	"GET /v1/slivers/{host}/{sliver}":       scopeAdmin,
	"PUT /v1/slivers/{host}/{sliver}":       scopeAdmin,
	"DELETE /v1/slivers/{host}/{sliver}":    scopeAdmin,
	"GET /v1/taps":                          scopeTap,
	"POST /v1/taps":                         scopeTap,
	"GET /v1/taps/{name}":                   scopeTap,
	"PUT /v1/taps/{name}":                   scopeTap,
	"DELETE /v1/taps/{name}":                scopeTap,
	"GET /v1/taps/{name}/capture":           scopeTap,
	"GET /v1/observe":                       scopeOwnFarm, // a tenant's stream carries its own farm's events only (observeFilter)
	"GET /v1/lisp/mappings":                 scopeAdmin,
	"POST /v1/lisp/mappings":                scopeAdmin,
	"GET /v1/lisp/mappings/{addr}/{len}":    scopeAdmin,
	"DELETE /v1/lisp/mappings/{addr}/{len}": scopeAdmin,
	"GET /v1/lisp/server":                   scopeAdmin,
	"GET /v1/tenants/tokens":                scopeAdmin,
	"POST /v1/tenants/tokens":               scopeAdmin,
	"DELETE /v1/tenants/tokens/{id}":        scopeAdmin,
	"GET /v1/tenants/cert-revocations":      scopeAdmin,
	"POST /v1/tenants/cert-revocations":     scopeAdmin,
	"GET /v1/plan":                          scopeRead,
	// The pool of floating addresses is the cloud's (api_floating.go says why
	// a tenant may not attach one either).
	"GET /v1/floating":                 scopeAdmin,
	"POST /v1/floating":                scopeAdmin,
	"DELETE /v1/floating/{address}":    scopeAdmin,
	"PUT /v1/floating/{address}/vm":    scopeAdmin,
	"DELETE /v1/floating/{address}/vm": scopeAdmin,
	"PUT /v1/plan":                     scopeAdmin,
}

// scopeOf is pattern's scope: its line in routeScopes, else scopeFarm for
// a path with {farm}.
func scopeOf(pattern string) (scope, error) {
	if s, ok := routeScopes[pattern]; ok {
		return s, nil
	}
	if strings.Contains(pattern, "/{farm}") {
		return scopeFarm, nil
	}
	return 0, fmt.Errorf("route %q has no authorization scope: a path with {farm} is scoped to that farm by itself; any other route needs its line in routeScopes (internal/controller/authz.go, docs/tenants.md)", pattern)
}

// router is what each noun's routes register with (api.go): a ServeMux
// whose every route is authorized by its scope and, when it writes,
// recorded in the audit trail.
type router struct {
	c      *Controller
	mux    *http.ServeMux
	scopes map[string]scope // by pattern, as registered
}

// HandleFunc registers h for pattern, authorized by pattern's scope.
func (rt *router) HandleFunc(pattern string, h http.HandlerFunc) { rt.Handle(pattern, h) }

// Handle registers h for pattern, authorized by pattern's scope. A route
// with no scope is a programming error: it panics, so that no test that
// builds the API passes with it.
func (rt *router) Handle(pattern string, h http.Handler) {
	s, err := scopeOf(pattern)
	if err != nil {
		panic(err)
	}
	rt.scopes[pattern] = s
	rt.mux.Handle(pattern, rt.c.authorize(pattern, s, h))
}

// ErrForbidden is a credential acting beyond its scope (403): a tenant on
// another farm's object or on a cloud-wide operation.
var ErrForbidden = errors.New("permission denied")

// forbidden says id may not do what it asked (403); the message says it is
// a permission problem, not whether the object exists.
func forbidden(field string, id Identity, format string, a ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf("permission denied: %s: ", id) + fmt.Sprintf(format, a...), kind: ErrForbidden}
}

// farmForbidden is the 403 of a tenant naming another farm.
func farmForbidden(field string, id Identity, farm string) error {
	return forbidden(field, id, "this credential acts on farm %s only, not on farm %s", id.Farm, farm)
}

// mayActOn reports whether id may act on farm's objects, as a 403 error.
func mayActOn(id Identity, field, farm string) error {
	if id.Admin() || farm == id.Farm {
		return nil
	}
	return farmForbidden(field, id, farm)
}

// ownFarm is the farm a list is narrowed to for the caller: a tenant's
// own, "" (every farm) for an admin.
func ownFarm(ctx context.Context) string { return IdentityOf(ctx).Farm }

// inFarm reports whether a FARM/... name (or a farm's own name) belongs to
// farm; every name does when farm is "".
func inFarm(name, farm string) bool {
	return farm == "" || name == farm || strings.HasPrefix(name, farm+"/")
}

// authorize wraps one route's handler: it refuses what the caller's scope
// does not allow (403) and records every accepted write in the audit trail.
func (c *Controller) authorize(pattern string, s scope, h http.Handler) http.Handler {
	method, _, _ := strings.Cut(pattern, " ")
	write := method != "GET" && method != "HEAD" && method != "" && !strings.HasPrefix(method, "/")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := IdentityOf(r.Context())
		if !id.Admin() {
			var err error
			switch s {
			case scopeAdmin:
				err = forbidden("path", id, "%s %s is the operator's (an admin credential's), not a tenant's", r.Method, r.URL.Path)
			case scopeFarm:
				err = mayActOn(id, "farm", r.PathValue("farm"))
			}
			if err != nil {
				reply(w, 0, nil, err)
				return
			}
		}
		if !write {
			h.ServeHTTP(w, r)
			return
		}
		c.audited(w, r, pattern, id, h)
	})
}

// authorizeTap says whether the caller may write policy p (as resolved:
// sender, receiver and monitor by name). A tenant may copy only its own
// farm's traffic: the sender's and the receiver's farm ("any" is the
// monitor's farm) must be its own. The monitor may be in another farm
// only as the policy's checks allow (cross-farm, the two farms peering
// both ways): that farm's own half of the peering, which only its
// credentials can write, is its consent to receive the copies.
func authorizeTap(ctx context.Context, p intent.TapPolicy) error {
	id := IdentityOf(ctx)
	if id.Admin() {
		return nil
	}
	for _, end := range []struct{ field, ref string }{{"sender", p.Sender}, {"receiver", p.Receiver}} {
		farm := refFarm(end.ref, p.Monitor)
		if farm != id.Farm {
			return forbidden(end.field, id, "tap %s copies farm %s's traffic (%s %s): a tenant taps its own farm's traffic only (farm %s)", p.Name, farm, end.field, end.ref, id.Farm)
		}
	}
	return nil
}

// tapVisible says whether the caller may see policy p: an admin every
// one, a tenant those naming its farm as sender, receiver or monitor.
func tapVisible(ctx context.Context, p intent.TapPolicy) bool {
	id := IdentityOf(ctx)
	return id.Admin() || slices.Contains([]string{refFarm(p.Sender, p.Monitor), refFarm(p.Receiver, p.Monitor), refFarm(p.Monitor, "")}, id.Farm)
}

// refFarm is the farm of a stored TAP end (farm/subnet/vm, farm/subnet or
// any, which is any VM of the monitor's farm).
func refFarm(ref, monitor string) string {
	if ref == "any" || ref == "" {
		ref = monitor
	}
	f, _, _ := strings.Cut(ref, "/")
	return f
}
