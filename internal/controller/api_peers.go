package controller

import (
	"context"
	"errors"
	"net/http"
	"sort"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// peerRoutes serves peerings: a farm agreeing to talk to another.
func (c *Controller) peerRoutes(mux *router) {
	mux.HandleFunc("PUT /v1/farms/{farm}/peers/{with}", func(w http.ResponseWriter, r *http.Request) {
		mutual, err := c.Peer(r.Context(), r.PathValue("farm"), r.PathValue("with"))
		reply(w, http.StatusOK, map[string]bool{"mutual": mutual}, err)
	})
}

// Peer records that farm agrees to talk to other; traffic flows only once
// other peers back.
func (c *Controller) Peer(ctx context.Context, farm, other string) (mutual bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, err := c.getFarm(ctx, farm)
	if err != nil {
		return false, err
	}
	o, err := c.getFarm(ctx, other)
	if errors.Is(err, ErrNotFound) {
		return false, fieldErr("with", err)
	} else if err != nil {
		return false, err
	}
	if farm == other {
		return false, fieldErr("with", errors.New("a farm always talks to itself"))
	}
	has := func(list []string, s string) bool {
		for _, x := range list {
			if x == s {
				return true
			}
		}
		return false
	}
	if !has(f.Peers, other) {
		f.Peers = append(f.Peers, other)
		sort.Strings(f.Peers)
		if err := store.PutJSON(ctx, c.store, intent.FarmsPrefix+farm, f); err != nil {
			return false, err
		}
	}
	return has(o.Peers, farm), nil
}
