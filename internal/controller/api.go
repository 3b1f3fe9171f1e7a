package controller

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
)

// API is the controller's REST API (api/openapi.yaml documents it). Each noun
// has its own file, api_NOUN.go, with its handlers and operations.
//
// Every route is authorized by its scope (authz.go) and every accepted
// write recorded in the audit trail (api_audit.go): the identity comes from
// the request's context (Authenticate on the TCP listener; none, an admin,
// on the unix socket).
func (c *Controller) API() http.Handler {
	mux := c.routes()
	return mux.mux
}

// routes registers every route with a router and returns it.
func (c *Controller) routes() *router {
	mux := &router{c: c, mux: http.NewServeMux(), scopes: map[string]scope{}}
	// One line per noun: a new feature adds its file and a line here.
	for _, register := range []func(*router){
		c.hostRoutes,
		c.farmRoutes,
		c.egressRoutes,
		c.publishRoutes,
		c.floatingRoutes,
		c.subnetRoutes,
		c.vmRoutes,
		c.firewallRoutes,
		c.ruleRoutes,
		c.peerRoutes,
		c.statusRoutes,
		c.sliverRoutes,
		c.tapRoutes,
		c.lispRoutes,
		c.storeRoutes,
		c.tenantRoutes,
		c.auditRoutes,
		c.versionRoutes,
		c.planRoutes,
		c.observeRoutes,
		c.traceRoutes,
	} {
		register(mux)
	}
	// Whatever no route takes (an unknown path, a method a path does not
	// have) gets a JSON error naming the path, like every other error.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, FieldError{Field: "path",
			Msg: fmt.Sprintf("no operation %s %s (api/openapi.yaml lists them)", r.Method, r.URL.Path)})
	})
	return mux
}

// MaxBody is the largest request body the API reads; a larger one is
// answered 413.
const MaxBody = 1 << 20

// decode reads a JSON body: one object, no unknown fields, nothing after it
// but white space, at most MaxBody bytes. It answers the request itself and
// returns false when the body is wrong.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		end := dec.InputOffset()
		if _, err = dec.Token(); err == io.EOF {
			return true
		} else if !isTooLarge(err) {
			err = fmt.Errorf("unexpected data after the JSON object, at byte %d: want one object", end)
		}
	}
	status, fe := bodyError(err, dec.InputOffset())
	writeJSON(w, status, fe)
	return false
}

func isTooLarge(err error) bool {
	var mb *http.MaxBytesError
	return errors.As(err, &mb)
}

// bodyError says what is wrong with a body that did not decode, naming the
// field where the decoder knows it; offset is how far it read.
func bodyError(err error, offset int64) (int, *FieldError) {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	fe := &FieldError{Field: "body", Msg: "invalid JSON body: " + err.Error()}
	switch {
	case isTooLarge(err):
		return http.StatusRequestEntityTooLarge, &FieldError{Field: "body",
			Msg: fmt.Sprintf("body is larger than the limit of %d bytes", MaxBody)}
	case err == io.EOF:
		fe.Msg = "invalid JSON body: empty; want a JSON object"
	case errors.Is(err, io.ErrUnexpectedEOF):
		fe.Msg = fmt.Sprintf("invalid JSON body: it ends at byte %d inside the object", offset)
	case errors.As(err, &syn):
		fe.Msg = fmt.Sprintf("invalid JSON body at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ) && typ.Field != "":
		fe.Field = typ.Field
		fe.Msg = fmt.Sprintf("invalid JSON body: %s is a %s, want a %s (byte %d)", typ.Field, typ.Value, typ.Type, typ.Offset)
	case errors.As(err, &typ):
		fe.Msg = fmt.Sprintf("invalid JSON body: a %s, want a JSON object", typ.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// encoding/json has no type for it; the message is its API.
		if name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`); name != "" {
			fe.Field = name
		}
	}
	return http.StatusBadRequest, fe
}

// reply answers with v and status ok, or with err as JSON naming its field:
// 400 for a bad value, 404, 409, and 500 only for what the client cannot fix
// (the store failing).
func reply(w http.ResponseWriter, ok int, v any, err error) {
	var fe *FieldError
	switch {
	case err == nil:
		if v == nil {
			w.WriteHeader(ok)
			return
		}
		writeJSON(w, ok, v)
	case errors.As(err, &fe) && errors.Is(fe, ErrNotFound):
		writeJSON(w, http.StatusNotFound, fe)
	case errors.As(err, &fe) && errors.Is(fe, ErrForbidden):
		writeJSON(w, http.StatusForbidden, fe)
	case errors.As(err, &fe) && (errors.Is(fe, ErrConflict) || errors.Is(fe, ErrFull)):
		writeJSON(w, http.StatusConflict, fe)
	case errors.As(err, &fe):
		writeJSON(w, http.StatusBadRequest, fe)
	default:
		writeJSON(w, http.StatusInternalServerError, FieldError{Msg: err.Error()})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// list answers every record under prefix as a JSON array.
func (c *Controller) list(prefix string, newSlice func() any) http.HandlerFunc {
	return c.listBy(prefix, newSlice, false)
}

// farmList is list for records keyed FARM or FARM/...: a tenant is
// answered its own farm's only (scopeOwnFarm).
func (c *Controller) farmList(prefix string, newSlice func() any) http.HandlerFunc {
	return c.listBy(prefix, newSlice, true)
}

func (c *Controller) listBy(prefix string, newSlice func() any, byFarm bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		kvs, _, err := c.store.List(r.Context(), prefix)
		if err != nil {
			reply(w, 0, nil, err)
			return
		}
		farm := ""
		if byFarm {
			farm = ownFarm(r.Context())
		}
		keys := make([]string, 0, len(kvs))
		for k := range kvs {
			if inFarm(strings.TrimPrefix(k, prefix), farm) {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, string(kvs[k]))
		}
		out := newSlice()
		if err := json.Unmarshal([]byte("["+strings.Join(parts, ",")+"]"), out); err != nil {
			reply(w, 0, nil, fmt.Errorf("decode %s: %w", prefix, err))
			return
		}
		writeJSON(w, http.StatusOK, out)
	}
}
