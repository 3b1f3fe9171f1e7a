package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/tappolicy"
)

// TapView is a TAP policy as the API answers it: the record, its filters
// in the CLI's words, and, when today's intent cannot enforce it (a VM it
// names was deleted, a peering it relies on withdrawn), why it copies
// nothing.
type TapView struct {
	intent.TapPolicy
	Filter  string `json:"filter"`
	Problem string `json:"problem,omitempty"`
}

func tapViewOf(p intent.TapPolicy, w *tappolicy.World) TapView {
	v := TapView{TapPolicy: p, Filter: tappolicy.Describe(p.TapFilter)}
	if w != nil {
		if _, err := w.Rules(p); err != nil {
			v.Problem = err.Error()
		}
	}
	return v
}

// tapBody is what POST and PUT read: the record's fields, flat (a struct
// embedded in the body would make the decoder name a wrong field
// "TapFilter.proto" rather than "proto").
type tapBody struct {
	Name           string `json:"name"`
	ID             uint32 `json:"id"`
	Sender         string `json:"sender"`
	Receiver       string `json:"receiver"`
	Monitor        string `json:"monitor"`
	Collector      string `json:"collector"`
	Encap          string `json:"encap"`
	Proto          uint8  `json:"proto"`
	SportLo        uint16 `json:"sportLo"`
	SportHi        uint16 `json:"sportHi"`
	DportLo        uint16 `json:"dportLo"`
	DportHi        uint16 `json:"dportHi"`
	VLAN           uint16 `json:"vlan"`
	BothDirections bool   `json:"bothDirections"`
	CrossFarm      bool   `json:"crossFarm"`
}

func (b tapBody) policy() intent.TapPolicy {
	return intent.TapPolicy{Name: b.Name, ID: b.ID, Sender: b.Sender, Receiver: b.Receiver, Monitor: b.Monitor,
		Collector: b.Collector, Encap: b.Encap,
		TapFilter:      intent.TapFilter{Proto: b.Proto, SportLo: b.SportLo, SportHi: b.SportHi, DportLo: b.DportLo, DportHi: b.DportHi, VLAN: b.VLAN},
		BothDirections: b.BothDirections, CrossFarm: b.CrossFarm}
}

// tapRoutes serves virtual TAP policies (paper 002): copies of what a
// sender sends a receiver go to a monitor VM.
func (c *Controller) tapRoutes(mux *router) {
	mux.HandleFunc("GET /v1/taps", func(w http.ResponseWriter, r *http.Request) {
		out, err := c.ListTaps(r.Context())
		// A tenant sees the policies naming its farm (scopeTap).
		out = slices.DeleteFunc(out, func(v TapView) bool { return !tapVisible(r.Context(), v.TapPolicy) })
		reply(w, http.StatusOK, out, err)
	})
	mux.HandleFunc("POST /v1/taps", func(w http.ResponseWriter, r *http.Request) {
		var in tapBody
		if decode(w, r, &in) {
			p, err := c.CreateTap(r.Context(), in.policy())
			c.replyTap(w, r, http.StatusCreated, p, err)
		}
	})
	mux.HandleFunc("GET /v1/taps/{name}", func(w http.ResponseWriter, r *http.Request) {
		p, err := c.getTap(r.Context(), r.PathValue("name"))
		if err == nil && !tapVisible(r.Context(), p) {
			err = forbidden("name", IdentityOf(r.Context()), "tap %s names none of farm %s's VMs or subnets", p.Name, IdentityOf(r.Context()).Farm)
		}
		c.replyTap(w, r, http.StatusOK, p, err)
	})
	mux.HandleFunc("PUT /v1/taps/{name}", func(w http.ResponseWriter, r *http.Request) {
		var in tapBody
		if decode(w, r, &in) {
			if in.Name == "" {
				in.Name = r.PathValue("name")
			}
			var p intent.TapPolicy
			err := fieldErr("name", fmt.Errorf("the body names tap %q, the path %q: a tap is not renamed", in.Name, r.PathValue("name")))
			if in.Name == r.PathValue("name") {
				p, err = c.ReplaceTap(r.Context(), in.policy())
			}
			c.replyTap(w, r, http.StatusOK, p, err)
		}
	})
	mux.HandleFunc("GET /v1/taps/{name}/capture", c.captureTap) // api_tapcapture.go
	mux.HandleFunc("DELETE /v1/taps/{name}", func(w http.ResponseWriter, r *http.Request) {
		if p, err := c.getTap(r.Context(), r.PathValue("name")); err == nil {
			noteFarm(r.Context(), refFarm(p.Sender, p.Monitor))
		}
		reply(w, http.StatusNoContent, nil, c.DeleteTap(r.Context(), r.PathValue("name")))
	})
}

// replyTap answers p's view, or err.
func (c *Controller) replyTap(w http.ResponseWriter, r *http.Request, status int, p intent.TapPolicy, err error) {
	if err != nil {
		reply(w, status, nil, err)
		return
	}
	noteFarm(r.Context(), refFarm(p.Sender, p.Monitor))
	reply(w, status, c.tapView(r.Context(), p), nil)
}

// tapView is p's view on today's intent; if the intent cannot be read, the
// record alone (the write or read that made p has succeeded already).
func (c *Controller) tapView(ctx context.Context, p intent.TapPolicy) TapView {
	w, err := c.tapWorld(ctx)
	if err != nil {
		c.log.Warn("tap view: read intent", "err", err)
		return tapViewOf(p, nil)
	}
	return tapViewOf(p, w)
}

// tapWorld is the intent policies are resolved against.
func (c *Controller) tapWorld(ctx context.Context) (*tappolicy.World, error) {
	farms, _, err := store.ListJSON[intent.Farm](ctx, c.store, intent.FarmsPrefix)
	if err != nil {
		return nil, err
	}
	subnets, _, err := store.ListJSON[intent.Subnet](ctx, c.store, intent.SubnetsPrefix)
	if err != nil {
		return nil, err
	}
	vms, _, err := store.ListJSON[intent.VM](ctx, c.store, intent.VMsPrefix)
	if err != nil {
		return nil, err
	}
	return tappolicy.NewWorld(farms, subnets, vms), nil
}

// ListTaps returns every TAP policy, by name.
func (c *Controller) ListTaps(ctx context.Context) ([]TapView, error) {
	all, _, err := store.ListJSON[intent.TapPolicy](ctx, c.store, intent.TapsPrefix)
	if err != nil {
		return nil, err
	}
	w, err := c.tapWorld(ctx)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(all, func(a, b intent.TapPolicy) int { return strings.Compare(a.Name, b.Name) })
	out := make([]TapView, len(all))
	for i, p := range all {
		out[i] = tapViewOf(p, w)
	}
	return out, nil
}

func tapKey(name string) string { return intent.TapsPrefix + name }

func (c *Controller) getTap(ctx context.Context, name string) (intent.TapPolicy, error) {
	var p intent.TapPolicy
	b, err := c.store.Get(ctx, tapKey(name))
	if errors.Is(err, store.ErrNotFound) {
		return p, notFound("name", "tap %s", name)
	} else if err != nil {
		return p, err
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("decode %s: %w", tapKey(name), err)
	}
	return p, nil
}

// CreateTap checks p against today's VMs, subnets and peerings, stores it
// with sender, receiver and monitor by name (an IP or MAC resolved to its
// VM) and gives it the lowest free ID.
func (c *Controller) CreateTap(ctx context.Context, p intent.TapPolicy) (intent.TapPolicy, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.ID != 0 {
		return intent.TapPolicy{}, fieldErr("id", fmt.Errorf("id %d: the controller allocates a tap's id; leave it out", p.ID))
	}
	return c.writeTap(ctx, p, true, nil)
}

// ReplaceTap replaces the policy p.Name, checked as on create; its ID stays.
func (c *Controller) ReplaceTap(ctx context.Context, p intent.TapPolicy) (intent.TapPolicy, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writeTap(ctx, p, false, nil)
}

// DeleteTap removes a policy; every host drops its rules at the next
// compile, and its ID is free again.
func (c *Controller) DeleteTap(ctx context.Context, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, err := c.getTap(ctx, name)
	if err != nil {
		return err
	}
	if err := authorizeTap(ctx, p); err != nil {
		return err
	}
	return c.store.Delete(ctx, tapKey(name))
}

// tapErr turns a tappolicy error into the API's, naming the JSON field.
func tapErr(err error) error {
	var fe *tappolicy.FieldError
	if errors.As(err, &fe) {
		return &FieldError{Field: fe.Field, Msg: fe.Msg}
	}
	return err
}

// writeTap checks p and writes it: create (refused if the name exists,
// lowest free ID) or replace (it must exist, its ID stays). The write is a
// compare-and-swap on every tap key: if any was written after the read
// this decision was made on (another controller on the same etcd), it
// starts over on what is there now, so two writers never take one ID.
// fabric are the node records a collector is checked against: nil reads
// the store's (what the agents reported).
func (c *Controller) writeTap(ctx context.Context, p intent.TapPolicy, create bool, fabric []intent.Node) (intent.TapPolicy, error) {
	if err := tappolicy.CheckName(p.Name); err != nil {
		if !create {
			return intent.TapPolicy{}, notFound("name", "tap %s", p.Name)
		}
		return intent.TapPolicy{}, fieldErr("name", err)
	}
	return decideAndWrite(ctx, c, intent.TapsPrefix, "tap "+p.Name, func(all []intent.TapPolicy) (string, intent.TapPolicy, error) {
		var others []intent.TapPolicy
		var self *intent.TapPolicy
		for i := range all {
			if all[i].Name == p.Name {
				self = &all[i]
				continue
			}
			others = append(others, all[i])
		}
		switch {
		case create && self != nil:
			return "", intent.TapPolicy{}, conflict("name", "tap %s (id %d, %s -> %s, monitor %s)", p.Name, self.ID, self.Sender, self.Receiver, self.Monitor)
		case !create && self == nil:
			return "", intent.TapPolicy{}, notFound("name", "tap %s", p.Name)
		case !create && p.ID != 0 && p.ID != self.ID:
			return "", intent.TapPolicy{}, fieldErr("id", fmt.Errorf("id %d: tap %s has id %d, which stays while it lives", p.ID, p.Name, self.ID))
		}
		// What a replace overwrites must be the caller's too.
		if self != nil {
			if err := authorizeTap(ctx, *self); err != nil {
				return "", intent.TapPolicy{}, err
			}
		}
		// Named ends of another farm are refused before they are looked
		// up: a tenant learns nothing of what another farm holds.
		if id := IdentityOf(ctx); !id.Admin() {
			for _, end := range []struct{ field, ref string }{{"sender", p.Sender}, {"receiver", p.Receiver}} {
				if f, _, named := strings.Cut(end.ref, "/"); named && f != id.Farm {
					return "", intent.TapPolicy{}, farmForbidden(end.field, id, f)
				}
			}
		}
		w, err := c.tapWorld(ctx)
		if err != nil {
			return "", intent.TapPolicy{}, err
		}
		if p.Collector != "" {
			// A collector must be on the fabric: the hosts' uplinks say
			// where that is.
			nodes := fabric
			if nodes == nil {
				if nodes, _, err = store.ListJSON[intent.Node](ctx, c.store, intent.NodesPrefix); err != nil {
					return "", intent.TapPolicy{}, err
				}
			}
			w.WithFabric(nodes)
		}
		resolved, err := w.Resolve(p)
		if err != nil {
			return "", intent.TapPolicy{}, tapErr(err)
		}
		// The caller must own the traffic it copies (an end given by
		// address is known only now).
		if err := authorizeTap(ctx, resolved); err != nil {
			return "", intent.TapPolicy{}, err
		}
		for _, o := range others {
			if sameTraffic(o, resolved) {
				return "", intent.TapPolicy{}, conflict("body", "tap %s copies the same traffic to the same monitor (id %d)", o.Name, o.ID)
			}
		}
		if self != nil {
			resolved.ID = self.ID
		} else if resolved.ID, err = freeTapID(others, c.maxTaps); err != nil {
			return "", intent.TapPolicy{}, err
		}
		return tapKey(p.Name), resolved, nil
	})
}

// sameTraffic reports whether two resolved policies copy the same packets
// to the same monitor: a second one would only cost a rule on every host.
func sameTraffic(a, b intent.TapPolicy) bool {
	a.Name, a.ID, b.Name, b.ID = "", 0, "", 0
	return a == b
}

// freeTapID is the lowest ID (1..limit) no other policy holds. An ID keys
// the policy's rules and counters on every host, so it never changes while
// the policy lives; limit is half of a host's rules, so that every policy
// fits on one host in both directions.
func freeTapID(others []intent.TapPolicy, limit int) (uint32, error) {
	used := make(map[uint32]bool, len(others))
	for _, o := range others {
		used[o.ID] = true
	}
	for id := uint32(1); id <= uint32(limit); id++ {
		if !used[id] {
			return id, nil
		}
	}
	return 0, full("name", fmt.Errorf("there are %d taps, as many as a host's datapath holds in both directions (%d), 0 left: delete one first", len(others), limit))
}
