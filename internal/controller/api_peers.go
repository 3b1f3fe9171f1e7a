package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/tappolicy"
)

// peerRoutes serves peerings: a farm agreeing to talk to another.
func (c *Controller) peerRoutes(mux *router) {
	mux.HandleFunc("PUT /v1/farms/{farm}/peers/{with}", func(w http.ResponseWriter, r *http.Request) {
		mutual, err := c.Peer(r.Context(), r.PathValue("farm"), r.PathValue("with"))
		reply(w, http.StatusOK, map[string]bool{"mutual": mutual}, err)
	})
	mux.HandleFunc("GET /v1/farms/{farm}/peers", func(w http.ResponseWriter, r *http.Request) {
		peers, err := c.Peers(r.Context(), r.PathValue("farm"))
		reply(w, http.StatusOK, peers, err)
	})
	mux.HandleFunc("DELETE /v1/farms/{farm}/peers/{with}", func(w http.ResponseWriter, r *http.Request) {
		cascade, err := cascadeParam(r)
		if err == nil {
			err = c.Unpeer(r.Context(), r.PathValue("farm"), r.PathValue("with"), cascade)
		}
		reply(w, http.StatusNoContent, nil, err)
	})
}

// cascadeParam reads ?cascade=true|false (absent: false).
func cascadeParam(r *http.Request) (bool, error) {
	switch v := r.URL.Query().Get("cascade"); v {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	default:
		return false, fieldErr("cascade", fmt.Errorf("cascade %q: want true or false", v))
	}
}

// PeerView is one half of a peering: farm agrees to talk to With, and
// Mutual says whether With agrees back (only then does traffic flow).
type PeerView struct {
	Farm   string `json:"farm"`
	With   string `json:"with"`
	Mutual bool   `json:"mutual"`
}

// Peer records that farm agrees to talk to other; traffic flows only once
// other peers back.
func (c *Controller) Peer(ctx context.Context, farm, other string) (mutual bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, o, err := c.peerFarms(ctx, farm, other)
	if err != nil {
		return false, err
	}
	if !slices.Contains(f.Peers, other) {
		f.Peers = append(f.Peers, other)
		sort.Strings(f.Peers)
		if err := store.PutJSON(ctx, c.store, intent.FarmsPrefix+farm, f); err != nil {
			return false, err
		}
	}
	return slices.Contains(o.Peers, farm), nil
}

// peerFarms reads both farms of a peering, checking they are two.
func (c *Controller) peerFarms(ctx context.Context, farm, other string) (f, o intent.Farm, err error) {
	if f, err = c.getFarm(ctx, farm); err != nil {
		return f, o, err
	}
	o, err = c.getFarm(ctx, other)
	if errors.Is(err, ErrNotFound) {
		return f, o, fieldErr("with", err)
	} else if err != nil {
		return f, o, err
	}
	if farm == other {
		return f, o, fieldErr("with", errors.New("a farm always talks to itself"))
	}
	return f, o, nil
}

// Peers lists the farms farm agrees to talk to, and whether each agrees
// back.
func (c *Controller) Peers(ctx context.Context, farm string) ([]PeerView, error) {
	f, err := c.getFarm(ctx, farm)
	if err != nil {
		return nil, err
	}
	out := []PeerView{}
	for _, with := range f.Peers {
		o, err := c.getFarm(ctx, with)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		out = append(out, PeerView{Farm: farm, With: with, Mutual: slices.Contains(o.Peers, farm)})
	}
	return out, nil
}

// Unpeer withdraws farm's half of its peering with other: traffic between
// them stops at once (new flows are refused, established ones cut and
// counted as revoked on every host), whatever rules either allows. A
// cross-farm TAP policy that relies on the peering refuses it (409 naming
// the policies) unless cascade, which deletes those policies first.
func (c *Controller) Unpeer(ctx context.Context, farm, other string, cascade bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, err := c.getFarm(ctx, farm)
	if err != nil {
		return err
	}
	i := slices.Index(f.Peers, other)
	if i < 0 {
		return notFound("with", "farm %s's peering with %s", farm, other)
	}
	taps, err := c.tapsRelyingOn(ctx, farm, other)
	if err != nil {
		return err
	}
	if len(taps) > 0 && !cascade {
		deps := make([]string, len(taps))
		for i, name := range taps {
			deps[i] = "tap " + name // a cross-farm policy: it copies only while the farms peer
		}
		return inUse("with", fmt.Sprintf("farm %s's peering with %s", farm, other), deps)
	}
	for _, name := range taps {
		if err := c.store.Delete(ctx, tapKey(name)); err != nil {
			return fmt.Errorf("cascade: delete tap %s: %w", name, err)
		}
	}
	f.Peers = slices.Delete(f.Peers, i, i+1)
	return store.PutJSON(ctx, c.store, intent.FarmsPrefix+farm, f)
}

// tapsRelyingOn names the cross-farm TAP policies whose monitor is in one
// of farms a and b and whose sender or receiver is in the other: they copy
// only while the two peer (tappolicy.CheckTenancy).
func (c *Controller) tapsRelyingOn(ctx context.Context, a, b string) ([]string, error) {
	all, _, err := store.ListJSON[intent.TapPolicy](ctx, c.store, intent.TapsPrefix)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range all {
		if !p.CrossFarm {
			continue
		}
		farmOf := func(ref string) string {
			r, err := tappolicy.ParseRef(ref)
			if err != nil || r.Kind == tappolicy.KindAny {
				return ""
			}
			return r.Farm
		}
		mon := farmOf(p.Monitor)
		for _, end := range []string{farmOf(p.Sender), farmOf(p.Receiver)} {
			if (mon == a && end == b) || (mon == b && end == a) {
				out = append(out, p.Name)
				break
			}
		}
	}
	sort.Strings(out)
	return out, nil
}
