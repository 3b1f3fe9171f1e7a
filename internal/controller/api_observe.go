package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/observe"
	"github.com/onehop/onehop/internal/store"
)

// Bounds of one onehop observe stream.
const (
	// MaxObserveDuration bounds a --follow stream: while it runs, every
	// host publishes admitted flows too.
	MaxObserveDuration = time.Hour
	// ObserveWindow is how long a stream without --follow collects: the
	// hosts' last events, and what comes meanwhile.
	ObserveWindow = 2 * time.Second
)

func (c *Controller) observeRoutes(mux *router) {
	mux.HandleFunc("GET /v1/observe", c.observe)
}

// observe serves onehop observe (GET /v1/observe): the hosts' events, as
// JSON lines, for as long as the request lasts (follow) or ObserveWindow.
//
// The controller serves it, not the agents: it is where callers are
// authenticated and scoped (a tenant sees only its farm's events), and
// it knows every host. While the request runs, a stream record
// (intent.ObservePrefix) makes the hosts it names publish to the
// controller's own address on the fabric, in UDP datagrams sealed with the
// record's key; when the request ends the record is deleted and the hosts
// stop, and switch their datapath's flow events off once no stream is left.
func (c *Controller) observe(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	q := r.URL.Query()
	f, err := c.observeFilter(ctx, q.Get("farm"), q.Get("vm"), q.Get("node"), q.Get("reason"))
	if err != nil {
		reply(w, 0, nil, err)
		return
	}
	follow := q.Get("follow") == "true" || q.Get("follow") == "1"
	hosts, self, err := c.captureAddrs(ctx)
	if err != nil {
		reply(w, http.StatusConflict, nil, err)
		return
	}
	conn, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(self, 0)))
	if err != nil {
		reply(w, http.StatusInternalServerError, nil, fmt.Errorf("observe: listen on %s: %w", self, err))
		return
	}
	defer conn.Close()
	sub := observe.Subscription{Collector: conn.LocalAddr().String(), Farm: f.Farm, Node: f.Node, Key: make([]byte, 32)}
	id := make([]byte, 8)
	rand.Read(id)
	rand.Read(sub.Key)
	sub.ID = hex.EncodeToString(id)
	b, err := json.Marshal(sub)
	if err == nil {
		err = c.store.Put(ctx, intent.ObservePrefix+sub.ID, b)
	}
	if err != nil {
		reply(w, http.StatusInternalServerError, nil, fmt.Errorf("observe: store the stream's record: %w", err))
		return
	}
	defer c.stopObserve(sub.ID)

	window := ObserveWindow
	if follow {
		window = MaxObserveDuration
	}
	ctx, cancel := context.WithTimeout(ctx, window)
	defer cancel()
	go func() {
		<-ctx.Done()
		conn.SetReadDeadline(time.Now()) // wakes the read below
	}()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	enc := json.NewEncoder(w)
	seqs := map[string]uint64{} // the last datagram seen of each host
	rules := c.observeRules(ctx)
	rulesAt := time.Now()
	buf := make([]byte, 65536)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return // the window's end, or the client gone
		}
		if !hosts[from.Addr().Unmap()] {
			continue // only hosts publish: anyone on the fabric can send UDP
		}
		d, err := observe.Open(sub.Key, buf[:n])
		if err != nil || d.Sub != sub.ID {
			continue
		}
		events := d.Events
		if last := seqs[d.Node]; d.Seq > last+1 && last > 0 {
			events = append([]observe.Event{{Time: time.Now(), Node: d.Node, Kind: observe.KindLost, Farm: f.Farm,
				Where: observe.LostNetwork, Lost: d.Seq - last - 1}}, events...)
		}
		seqs[d.Node] = max(seqs[d.Node], d.Seq)
		if time.Since(rulesAt) > observeRulesEvery {
			rules, rulesAt = c.observeRules(ctx), time.Now()
		}
		for _, e := range events {
			e.Node = d.Node
			if !f.Match(e) {
				continue
			}
			rules.Admitting(&e)
			if err := enc.Encode(e); err != nil {
				return
			}
		}
		rc.Flush()
	}
}

// observeRulesEvery is how old the rules a stream names admitted flows by
// may get: a rule changed meanwhile is named from then on.
const observeRulesEvery = 2 * time.Second

// observeRules are the farms' rules, to name the one that admitted each
// flow; none (flows shown without a rule) when the store cannot say.
func (c *Controller) observeRules(ctx context.Context) *observe.Rules {
	farms, _, err := store.ListJSON[intent.Farm](ctx, c.store, intent.FarmsPrefix)
	if err != nil {
		c.log.Warn("observe: read the farms' rules; flows are shown without theirs", "err", err)
	}
	subnets, _, err := store.ListJSON[intent.Subnet](ctx, c.store, intent.SubnetsPrefix)
	if err != nil {
		c.log.Warn("observe: read the subnets; flows are shown without their rules", "err", err)
	}
	return observe.NewRules(farms, subnets)
}

// observeFilter is the stream's filter from its query, scoped to the
// caller: a tenant sees its own farm's events only.
func (c *Controller) observeFilter(ctx context.Context, farm, vm, node, reason string) (observe.Filter, error) {
	var f observe.Filter
	id := IdentityOf(ctx)
	var parts []string
	if vm != "" {
		parts = strings.Split(vm, "/")
		if len(parts) != 3 {
			return f, fieldErr("vm", fmt.Errorf("vm %q: want farm/subnet/vm", vm))
		}
		if farm != "" && farm != parts[0] {
			return f, fieldErr("vm", fmt.Errorf("vm %q is not in farm %s", vm, farm))
		}
		farm = parts[0]
	}
	// Scoped before anything is looked up: a tenant learns nothing of
	// another farm's objects, not even whether they exist.
	if !id.Admin() {
		if farm != "" && farm != id.Farm {
			return f, farmForbidden("farm", id, farm)
		}
		farm = id.Farm
	}
	if parts != nil {
		v, err := c.getVM(ctx, parts[0], parts[1], parts[2])
		if err != nil {
			return f, err
		}
		if f.Addr, err = netip.ParseAddr(v.IP); err != nil {
			return f, fieldErr("vm", fmt.Errorf("vm %s has no address yet", vm))
		}
	}
	if farm != "" {
		fa, err := c.getFarm(ctx, farm)
		if err != nil {
			return f, err
		}
		f.Farm = uint32(fa.ID)
	}
	if node != "" {
		if _, err := c.store.Get(ctx, intent.NodesPrefix+node); errors.Is(err, store.ErrNotFound) {
			return f, notFound("node", "host %q has no agent", node)
		}
	}
	f.Node, f.Reason = node, reason
	return f, nil
}

// stopObserve deletes a stream's record, even when the request's context
// is gone: the hosts stop publishing to the controller.
func (c *Controller) stopObserve(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.store.Delete(ctx, intent.ObservePrefix+id); err != nil && !errors.Is(err, store.ErrNotFound) {
		c.log.Warn("observe: delete the stream's record; the hosts go on publishing to the controller until it is deleted", "stream", id, "err", err)
	}
}

// ClearObserves removes every stream record, as ClearCaptures does the
// captures': a record found at start is a dead controller's stream.
func (c *Controller) ClearObserves(ctx context.Context) error {
	return c.clearRecords(ctx, intent.ObservePrefix, "observe", func(k string, _ []byte) {
		c.log.Info("observe: removed the record of a stream whose controller stopped; its hosts stop publishing to it", "record", k)
	})
}
