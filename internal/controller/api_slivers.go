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
	"github.com/onehop/onehop/internal/lease"
	"github.com/onehop/onehop/internal/store"
)

// SliverView is a sliver as the API answers it: the record and its leases
// written back as the lease list they were given as.
type SliverView struct {
	intent.Sliver
	Ports string `json:"ports"`
}

func viewOf(s intent.Sliver) SliverView {
	return SliverView{Sliver: s, Ports: lease.Format(s.Leases)}
}

// sliverRoutes serves slivers (port-space isolation): guests that share
// their host's IPv4 and MAC and lease port ranges of it.
func (c *Controller) sliverRoutes(mux *router) {
	mux.HandleFunc("GET /v1/slivers", func(w http.ResponseWriter, r *http.Request) {
		out, err := c.ListSlivers(r.Context(), r.URL.Query().Get("host"))
		reply(w, http.StatusOK, out, err)
	})
	mux.HandleFunc("POST /v1/slivers", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Host  string `json:"host"`
			Name  string `json:"name"`
			Ports string `json:"ports"`
		}
		if decode(w, r, &in) {
			s, err := c.CreateSliver(r.Context(), in.Host, in.Name, in.Ports)
			reply(w, http.StatusCreated, viewOf(s), err)
		}
	})
	mux.HandleFunc("GET /v1/slivers/{host}/{sliver}", func(w http.ResponseWriter, r *http.Request) {
		s, _, err := c.getSliver(r.Context(), r.PathValue("host"), r.PathValue("sliver"))
		reply(w, http.StatusOK, viewOf(s), err)
	})
	mux.HandleFunc("PUT /v1/slivers/{host}/{sliver}", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Ports string `json:"ports"`
		}
		if decode(w, r, &in) {
			s, err := c.SetSliverPorts(r.Context(), r.PathValue("host"), r.PathValue("sliver"), in.Ports)
			reply(w, http.StatusOK, viewOf(s), err)
		}
	})
	mux.HandleFunc("DELETE /v1/slivers/{host}/{sliver}", func(w http.ResponseWriter, r *http.Request) {
		err := c.DeleteSliver(r.Context(), r.PathValue("host"), r.PathValue("sliver"))
		reply(w, http.StatusNoContent, nil, err)
	})
}

// ListSlivers returns every sliver, or host's only, by host then slot.
func (c *Controller) ListSlivers(ctx context.Context, host string) ([]SliverView, error) {
	prefix := intent.SliversPrefix
	if host != "" {
		if err := c.checkHost(ctx, "host", host); err != nil {
			return nil, err
		}
		prefix = intent.HostSliversPrefix(host)
	}
	all, _, err := store.ListJSON[intent.Sliver](ctx, c.store, prefix)
	if err != nil {
		return nil, err
	}
	sortSlivers(all)
	out := make([]SliverView, len(all))
	for i, s := range all {
		out[i] = viewOf(s)
	}
	return out, nil
}

func sortSlivers(ss []intent.Sliver) {
	slices.SortFunc(ss, func(a, b intent.Sliver) int {
		if c := strings.Compare(a.Host, b.Host); c != 0 {
			return c
		}
		return int(a.Slot) - int(b.Slot)
	})
}

// checkHost answers a 400 naming field for a host the store does not have.
func (c *Controller) checkHost(ctx context.Context, field, host string) error {
	if _, err := c.store.Get(ctx, intent.HostsPrefix+host); errors.Is(err, store.ErrNotFound) {
		return fieldErr(field, fmt.Errorf("no host %q", host))
	} else if err != nil {
		return err
	}
	return nil
}

func (c *Controller) getSliver(ctx context.Context, host, name string) (intent.Sliver, []byte, error) {
	var s intent.Sliver
	b, err := c.store.Get(ctx, intent.SliverKey(host, name))
	if errors.Is(err, store.ErrNotFound) {
		return s, nil, notFound("sliver", "sliver %s/%s", host, name)
	} else if err != nil {
		return s, nil, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, nil, fmt.Errorf("decode %s: %w", intent.SliverKey(host, name), err)
	}
	return s, b, nil
}

// CreateSliver records sliver name on host with the leases of ports (a
// lease list, "[UPLINK:]LO-HI[,...]") and gives it the lowest free slot.
func (c *Controller) CreateSliver(ctx context.Context, host, name, ports string) (intent.Sliver, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	leases, err := lease.Parse(ports)
	if err != nil {
		return intent.Sliver{}, fieldErr("ports", err)
	}
	return c.writeSliver(ctx, host, name, leases, true, nil)
}

// SetSliverPorts replaces the leases of host/name; its slot stays.
func (c *Controller) SetSliverPorts(ctx context.Context, host, name, ports string) (intent.Sliver, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	leases, err := lease.Parse(ports)
	if err != nil {
		return intent.Sliver{}, fieldErr("ports", err)
	}
	return c.writeSliver(ctx, host, name, leases, false, nil)
}

// DeleteSliver removes host/name; its ports and slot are free again.
func (c *Controller) DeleteSliver(ctx context.Context, host, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, _, err := c.getSliver(ctx, host, name); err != nil {
		return err
	}
	return c.store.Delete(ctx, intent.SliverKey(host, name))
}

// writeSliver checks leases against host's other slivers and its own
// ephemeral range and writes host/name: create (refused if it exists,
// lowest free slot) or replace (it must exist, its slot stays). uplinks
// are the uplink indexes the host has; nil takes them from its agent's
// node record.
//
// The decision is made on the host's whole lease space, slivers and
// slices, and written only if it is unchanged meanwhile (writeLeases), so
// two writers, on one controller or two, can never both take one range or
// one slot.
func (c *Controller) writeSliver(ctx context.Context, host, name string, leases []intent.Lease, create bool, uplinks []int) (intent.Sliver, error) {
	if err := lease.CheckSliverName(name); err != nil {
		return intent.Sliver{}, fieldErr("name", err)
	}
	if err := c.checkHost(ctx, "host", host); err != nil {
		if !create {
			return intent.Sliver{}, notFound("sliver", "sliver %s/%s", host, name)
		}
		return intent.Sliver{}, err
	}
	var s intent.Sliver
	err := c.writeLeases(ctx, host, "sliver "+host+"/"+name, func(ls *leaseSpace) ([]store.Op, bool, error) {
		var others []intent.Sliver
		var self *intent.Sliver
		for i := range ls.slivers {
			if ls.slivers[i].Name == name {
				self = &ls.slivers[i]
				continue
			}
			others = append(others, ls.slivers[i])
		}
		switch {
		case create && self != nil:
			return nil, false, conflict("name", "sliver %s/%s (slot %d, ports %s)", host, name, self.Slot, lease.Format(self.Leases))
		case !create && self == nil:
			return nil, false, notFound("sliver", "sliver %s/%s", host, name)
		}
		node, err := c.node(ctx, host)
		if err != nil {
			return nil, false, err
		}
		if err := checkUplinks(host, leases, node, uplinks); err != nil {
			return nil, false, err
		}
		lo, hi := lease.Ephemeral(node)
		if err := lease.Overlap(host, name, leases, append(others, ls.holders("")...), lo, hi); err != nil {
			return nil, false, &FieldError{Field: "ports", Msg: err.Error(), kind: ErrConflict}
		}
		s = intent.Sliver{Host: host, Name: name, Leases: leases}
		if self != nil {
			s.Slot = self.Slot
		} else if s.Slot, err = freeSlot(host, others, c.maxSlivers); err != nil {
			return nil, false, err
		}
		b, err := json.Marshal(s)
		if err != nil {
			return nil, false, fmt.Errorf("encode sliver %s/%s: %w", host, name, err)
		}
		return []store.Op{{Key: intent.SliverKey(host, name), Value: b}}, true, nil
	})
	return s, err
}

// node is host's node record, or an empty one (uplink 0 only, Linux's
// default ephemeral range) if its agent has not reported yet.
func (c *Controller) node(ctx context.Context, host string) (intent.Node, error) {
	var n intent.Node
	if err := store.GetJSON(ctx, c.store, intent.NodesPrefix+host, &n); err != nil && !errors.Is(err, store.ErrNotFound) {
		return n, err
	}
	return n, nil
}

// nodeUplinks are the uplink indexes a node record reports with an
// address. Every host has uplink 0, reported or not: an agent that
// predates multi-homing lists only Uplink*, and one not started yet
// nothing, and neither may keep a sliver from leasing on the one uplink
// every host has.
func nodeUplinks(n intent.Node) []int {
	out := []int{0}
	for _, u := range n.Uplinks {
		if u.IP != "" && !slices.Contains(out, u.Index) {
			out = append(out, u.Index)
		}
	}
	slices.Sort(out)
	return out
}

// checkUplinks refuses a lease on an uplink the host does not have (400).
func checkUplinks(host string, leases []intent.Lease, n intent.Node, uplinks []int) error {
	if uplinks == nil {
		uplinks = nodeUplinks(n)
	}
	for _, l := range leases {
		if !slices.Contains(uplinks, l.Uplink) {
			have := make([]string, len(uplinks))
			for i, u := range uplinks {
				have[i] = fmt.Sprint(u)
			}
			return fieldErr("ports", fmt.Errorf("lease %s is on uplink %d, but host %s has uplinks %s only (as its agent reports them)",
				lease.FormatOne(l), l.Uplink, host, strings.Join(have, ", ")))
		}
	}
	return nil
}

// freeSlot is the lowest slot (1..limit) no other sliver of host holds: a slot is the
// index of the sliver's state in the datapath, so it is never moved while
// the sliver lives, and freed only when it is deleted.
func freeSlot(host string, others []intent.Sliver, limit int) (uint32, error) {
	used := make(map[uint32]bool, len(others))
	for _, s := range others {
		used[s.Slot] = true
	}
	for slot := uint32(1); slot <= uint32(limit); slot++ {
		if !used[slot] {
			return slot, nil
		}
	}
	return 0, full("host", fmt.Errorf("host %q holds %d slivers, as many as its datapath holds (%d), 0 left: place the sliver on another host",
		host, len(others), limit))
}
