package controller

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/vnatloc"
)

// The controller is the VNAT location server (paper §3.3.2.1, the last
// resort of a moved end's locate walk; issue 10): it answers VCMP location
// queries and stores on TCP 2031 (DaemonConfig.LocationListen) with its
// records in etcd under vnatloc.Prefix, and it hands out no address a live
// record still holds virtually (§3.4.2, heldAddrs below). docs/vnat-location.md.

// locationState is what the controller keeps of its location server.
type locationState struct {
	// index is the held-address index, set once the server runs: nil
	// before (heldAddrs then reads the store).
	index atomic.Pointer[vnatloc.HeldIndex]
	// svc is the server once it runs, for /metrics.
	svc atomic.Pointer[vnatloc.Service]
}

var descLocation = prometheus.NewDesc("onehop_vnat_location_events_total",
	"VNAT location server events: answers by status, records stored, refreshed, released and expired, streams relayed, and every refusal (refused_REASON: relay, holder, owner, source, space, ...)",
	[]string{"event"}, nil)

// locationMetrics exports the location server's counters.
type locationMetrics struct{ c *Controller }

// Describe implements prometheus.Collector.
func (m locationMetrics) Describe(ch chan<- *prometheus.Desc) { ch <- descLocation }

// Collect implements prometheus.Collector: nothing until the server runs;
// every event and refusal reason is present from then on, 0 until it
// happens.
func (m locationMetrics) Collect(ch chan<- prometheus.Metric) {
	svc := m.c.loc.svc.Load()
	if svc == nil {
		return
	}
	counts := svc.Counters()
	for _, r := range vnatloc.RefusalReasons {
		if _, ok := counts["refused_"+r]; !ok {
			counts["refused_"+r] = 0
		}
	}
	for _, e := range vnatloc.Events {
		if _, ok := counts[e]; !ok {
			counts[e] = 0
		}
	}
	for k, v := range counts {
		ch <- prometheus.MustNewConstMetric(descLocation, prometheus.CounterValue, float64(v), k)
	}
}

// serveLocations starts the location server on addr (host:port) and
// returns its address once it listens; it stops when ctx ends. From then on heldAddrs
// asks the server's held-address index instead of reading every record.
// relayTLS is the agents' channel (a server configuration whose ClientCAs
// are the cluster's CA): hosts relay their VMs' streams over it with their
// agent's certificate; nil takes no relay.
func (c *Controller) serveLocations(ctx context.Context, addr string, streams accept.Limits, relayTLS *tls.Config, log *slog.Logger) (net.Addr, error) {
	s := c.raw
	// The index is listed before anything is allocated with it, and
	// follows every writer of the records (another controller's too).
	idx := vnatloc.NewHeldIndex(s, log)
	if err := idx.Start(ctx); err != nil {
		return nil, err
	}
	cfg := c.locationConfig()
	cfg.Logger, cfg.Index, cfg.Streams, cfg.Listeners, cfg.RelayTLS = log, idx, streams, c.listeners, relayTLS
	svc := vnatloc.New(s, cfg)
	if err := svc.Load(ctx); err != nil {
		return nil, err
	}
	l, err := (&net.ListenConfig{}).Listen(ctx, "tcp4", addr)
	if err != nil {
		return nil, fmt.Errorf("vnat location server: listen %s: %w", addr, err)
	}
	c.loc.index.Store(idx)
	c.loc.svc.Store(svc)
	go func() {
		if err := svc.Serve(ctx, l); err != nil {
			log.Error("vnat location server stopped", "err", err)
		}
	}()
	log.Info("serving VNAT locations", "on", l.Addr().String(), "records", svc.Len())
	return l.Addr(), nil
}

// locationConfig is what the location server asks the intent: who a
// source is, who holds a virtual address, which host may relay for a VM.
func (c *Controller) locationConfig() vnatloc.Config {
	s := c.raw
	return vnatloc.Config{
		RelayAllowed: func(ctx context.Context, node string, source netip.Addr) (bool, error) {
			return relayAllowed(ctx, s, node, source)
		},
		Identity: func(ctx context.Context, source netip.Addr) (string, error) {
			return vmIdentity(ctx, s, source)
		},
		Holder: func(ctx context.Context, virtual netip.Addr) (vnatloc.Holders, error) {
			return vmHolders(ctx, s, virtual)
		},
	}
}

// vmIdentity names the VM at source for the location server's ownership
// rule: "vm:FARM/NAME" (VM names are unique within a farm, and a VM keeps its farm and
// name across moves, so what it stored from one address it may refresh
// from the next); "" for an address no VM holds (an external: the address
// is its identity).
func vmIdentity(ctx context.Context, s store.Store, source netip.Addr) (string, error) {
	if !addrplan.Current().Contains(source) {
		return "", nil
	}
	vms, _, err := store.ListJSON[intent.VM](ctx, s, intent.VMsPrefix)
	if err != nil {
		return "", err
	}
	for _, v := range vms {
		if v.IP == source.String() {
			return "vm:" + v.Farm + "/" + v.Name, nil
		}
	}
	return "", nil
}

// relayAllowed: a host's agent relays the location streams of the VMs on
// its vifs (docs/vnat-location.md). The agent of node (the CN of the
// certificate its TLS channel was verified with) may speak for source only
// if the intent places a VM with address source on node: no host can
// store locations for another host's VMs, and nothing that is not an
// agent (a sliver shares its host's address, not its key) relays at all.
func relayAllowed(ctx context.Context, s store.Store, node string, source netip.Addr) (bool, error) {
	if node == "" {
		return false, nil
	}
	vms, _, err := store.ListJSON[intent.VM](ctx, s, intent.VMsPrefix)
	if err != nil {
		return false, err
	}
	for _, v := range vms {
		if v.IP == source.String() {
			return v.Host == node, nil
		}
	}
	return false, nil
}

// vmHolders names, by vmIdentity's names, the VM the intent gives a
// virtual address to now and the VMs that had it before a move to another
// subnet (intent.VM.Former): only they may claim it at the location
// server (no VM squats an address it never held).
func vmHolders(ctx context.Context, s store.Store, virtual netip.Addr) (vnatloc.Holders, error) {
	var h vnatloc.Holders
	vms, _, err := store.ListJSON[intent.VM](ctx, s, intent.VMsPrefix)
	if err != nil {
		return h, err
	}
	a := virtual.String()
	for _, v := range vms {
		if v.IP == a {
			h.Now = "vm:" + v.Farm + "/" + v.Name
		}
		if slices.Contains(v.Former, a) {
			h.Before = append(h.Before, "vm:"+v.Farm+"/"+v.Name)
		}
	}
	return h, nil
}

// heldAddrs are the addresses live VNAT location records hold virtually:
// an endpoint that moved away from one still uses it for its connections,
// so the controller must not give it to anyone else until the record
// expires or its holder releases it (paper §3.4.2). Every allocation of a
// VM address (CreateVM, MoveVM, ApplyTopology) skips them. While the
// location server runs they come from its index (vnatloc.HeldIndex: the
// cost of the held addresses, not of the records); otherwise, and while
// the index's watch is broken, from every record in the store. The set
// may be the index's shared one: callers only read it.
func (c *Controller) heldAddrs(ctx context.Context) (map[netip.Addr]bool, error) {
	var held map[netip.Addr]bool
	var err error
	if idx := c.loc.index.Load(); idx != nil {
		held, err = idx.HeldAt(ctx, time.Now())
	} else {
		held, err = vnatloc.Held(ctx, c.store, time.Now())
	}
	if err != nil {
		return nil, err
	}
	if len(held) > 0 && c.log.Enabled(ctx, slog.LevelDebug) { // sorting them costs
		c.log.Debug("addresses held by VNAT endpoints, not handed out", "addrs", vnatloc.HeldList(held))
	}
	return held, nil
}
