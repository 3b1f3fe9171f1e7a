package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/policy"
	"github.com/onehop/onehop/internal/store"
)

// API is the controller's REST API (api/openapi.yaml documents it).
func (c *Controller) API() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/hosts", c.list(intent.HostsPrefix, func() any { return &[]intent.Host{} }))
	mux.HandleFunc("GET /v1/farms", c.list(intent.FarmsPrefix, func() any { return &[]intent.Farm{} }))
	mux.HandleFunc("GET /v1/subnets", c.list(intent.SubnetsPrefix, func() any { return &[]intent.Subnet{} }))
	mux.HandleFunc("GET /v1/vms", c.list(intent.VMsPrefix, func() any { return &[]intent.VM{} }))
	mux.HandleFunc("GET /v1/status", c.list(intent.StatusPrefix, func() any { return &[]intent.AgentStatus{} }))
	mux.HandleFunc("GET /v1/rules", c.rules)
	mux.HandleFunc("POST /v1/farms", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Name     string `json:"name"`
			ProxyARP bool   `json:"proxyARP"`
		}
		if decode(w, r, &in) {
			f, err := c.CreateFarm(r.Context(), in.Name, in.ProxyARP)
			reply(w, http.StatusCreated, f, err)
		}
	})
	mux.HandleFunc("POST /v1/farms/{farm}/subnets", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Name string `json:"name"`
		}
		if decode(w, r, &in) {
			s, err := c.CreateSubnet(r.Context(), r.PathValue("farm"), in.Name)
			reply(w, http.StatusCreated, s, err)
		}
	})
	mux.HandleFunc("POST /v1/farms/{farm}/subnets/{subnet}/vms", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Name string `json:"name"`
			Host string `json:"host"`
		}
		if decode(w, r, &in) {
			v, err := c.CreateVM(r.Context(), r.PathValue("farm"), r.PathValue("subnet"), in.Name, in.Host)
			reply(w, http.StatusCreated, v, err)
		}
	})
	mux.HandleFunc("DELETE /v1/farms/{farm}/subnets/{subnet}/vms/{vm}", func(w http.ResponseWriter, r *http.Request) {
		err := c.DeleteVM(r.Context(), r.PathValue("farm"), r.PathValue("subnet"), r.PathValue("vm"))
		reply(w, http.StatusNoContent, nil, err)
	})
	mux.HandleFunc("PUT /v1/farms/{farm}/subnets/{subnet}/vms/{vm}/host", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Host string `json:"host"`
		}
		if decode(w, r, &in) {
			v, err := c.MoveVM(r.Context(), r.PathValue("farm"), r.PathValue("subnet"), r.PathValue("vm"), in.Host)
			reply(w, http.StatusOK, v, err)
		}
	})
	mux.HandleFunc("POST /v1/farms/{farm}/rules", func(w http.ResponseWriter, r *http.Request) {
		var in intent.Rule
		if decode(w, r, &in) {
			out, err := c.Allow(r.Context(), r.PathValue("farm"), in)
			reply(w, http.StatusCreated, out, err)
		}
	})
	mux.HandleFunc("PUT /v1/farms/{farm}/peers/{with}", func(w http.ResponseWriter, r *http.Request) {
		mutual, err := c.Peer(r.Context(), r.PathValue("farm"), r.PathValue("with"))
		reply(w, http.StatusOK, map[string]bool{"mutual": mutual}, err)
	})
	mux.HandleFunc("POST /v1/farms/{farm}/subnets/{subnet}/vms/{vm}/firewall", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			DefaultIn  string               `json:"defaultIn"`
			DefaultOut string               `json:"defaultOut"`
			Rule       *intent.FirewallRule `json:"rule"`
		}
		if decode(w, r, &in) {
			fw, err := c.AddFirewallRule(r.Context(), r.PathValue("farm"), r.PathValue("subnet"), r.PathValue("vm"), in.Rule, in.DefaultIn, in.DefaultOut)
			reply(w, http.StatusOK, fw, err)
		}
	})
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

// RuleView is a rule with its owner and whether it is in force.
type RuleView struct {
	Farm string `json:"farm"`
	intent.Rule
	Effective bool `json:"effective"` // within a farm always; across farms once both peer and allow
}

func (c *Controller) rules(w http.ResponseWriter, r *http.Request) {
	views, err := c.Rules(r.Context())
	reply(w, http.StatusOK, views, err)
}

// Rules lists every farm's rules and whether each is in force.
func (c *Controller) Rules(ctx context.Context) ([]RuleView, error) {
	farms, _, err := store.ListJSON[intent.Farm](ctx, c.store, intent.FarmsPrefix)
	if err != nil {
		return nil, err
	}
	subnets, _, err := store.ListJSON[intent.Subnet](ctx, c.store, intent.SubnetsPrefix)
	if err != nil {
		return nil, err
	}
	sort.Slice(farms, func(i, j int) bool { return farms[i].Name < farms[j].Name })
	effective := map[string]bool{}
	ids := map[string]intent.Subnet{}
	farmIDs := map[string]uint8{}
	for _, f := range farms {
		farmIDs[f.Name] = f.ID
	}
	for _, s := range subnets {
		ids[s.Farm+"/"+s.Name] = s
	}
	for _, v := range policy.Visibility(farms, subnets) {
		effective[fmt.Sprint(v.SrcFarm, v.SrcSubnet, v.DstFarm, v.DstSubnet)] = true
	}
	views := []RuleView{}
	for _, f := range farms {
		for _, rule := range f.Rules {
			from, to := ids[rule.From], ids[rule.To]
			key := fmt.Sprint(farmIDs[from.Farm], from.ID, farmIDs[to.Farm], to.ID)
			views = append(views, RuleView{Farm: f.Name, Rule: rule, Effective: effective[key]})
		}
	}
	return views, nil
}
