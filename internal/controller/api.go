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
func (c *Controller) API() http.Handler {
	mux := http.NewServeMux()
	// One line per noun: a new feature adds its file and a line here.
	for _, register := range []func(*http.ServeMux){
		c.hostRoutes,
		c.farmRoutes,
		c.subnetRoutes,
		c.vmRoutes,
		c.firewallRoutes,
		c.ruleRoutes,
		c.peerRoutes,
		c.statusRoutes,
	} {
		register(mux)
	}
	return mux
}

// decode reads a JSON body, rejecting unknown fields; it answers the request
// itself and returns false when the body is wrong.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		field := "body"
		if strings.Contains(err.Error(), "unknown field") {
			field = strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		}
		writeJSON(w, http.StatusBadRequest, FieldError{Field: field, Msg: "invalid JSON body: " + err.Error()})
		return false
	}
	return true
}

func reply(w http.ResponseWriter, ok int, v any, err error) {
	var fe *FieldError
	switch {
	case err == nil:
		if v == nil {
			w.WriteHeader(ok)
			return
		}
		writeJSON(w, ok, v)
	case errors.As(err, &fe):
		writeJSON(w, http.StatusBadRequest, fe)
	case errors.Is(err, ErrNotFound):
		writeJSON(w, http.StatusNotFound, FieldError{Msg: err.Error()})
	case errors.Is(err, ErrConflict):
		writeJSON(w, http.StatusConflict, FieldError{Msg: err.Error()})
	default:
		writeJSON(w, http.StatusInternalServerError, FieldError{Msg: err.Error()})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func (c *Controller) list(prefix string, newSlice func() any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		kvs, _, err := c.store.List(r.Context(), prefix)
		if err != nil {
			reply(w, 0, nil, err)
			return
		}
		keys := make([]string, 0, len(kvs))
		for k := range kvs {
			keys = append(keys, k)
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
