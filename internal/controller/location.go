package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/onehop/onehop/internal/accept"
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
}

// serveLocations starts the location server on addr (host:port) and
// returns its address once it listens; it stops when ctx ends. From then on heldAddrs
// asks the server's held-address index instead of reading every record.
func (c *Controller) serveLocations(ctx context.Context, addr string, streams accept.Limits, log *slog.Logger) (net.Addr, error) {
	s := c.raw
	// The index is listed before anything is allocated with it, and
	// follows every writer of the records (another controller's too).
	idx := vnatloc.NewHeldIndex(s, log)
	if err := idx.Start(ctx); err != nil {
		return nil, err
	}
	svc := vnatloc.New(s, vnatloc.Config{Logger: log, Index: idx, Streams: streams, Listeners: c.listeners,
		RelayAllowed: func(ctx context.Context, sender, source netip.Addr) (bool, error) {
			return relayAllowed(ctx, s, sender, source)
		},
		Identity: func(ctx context.Context, source netip.Addr) (string, error) {
			return vmIdentity(ctx, s, source)
		}})
	if err := svc.Load(ctx); err != nil {
		return nil, err
	}
	l, err := (&net.ListenConfig{}).Listen(ctx, "tcp4", addr)
	if err != nil {
		return nil, fmt.Errorf("vnat location server: listen %s: %w", addr, err)
	}
	c.loc.index.Store(idx)
	go func() {
		if err := svc.Serve(ctx, l); err != nil {
			log.Error("vnat location server stopped", "err", err)
		}
	}()
	log.Info("serving VNAT locations", "on", l.Addr().String(), "records", svc.Len())
	return l.Addr(), nil
}

// vmIdentity names the VM at source for the location server's ownership
// rule: "vm:FARM/NAME" (VM names are unique, and a VM keeps its farm and
// name across moves, so what it stored from one address it may refresh
// from the next); "" for an address no VM holds (an external: the address
// is its identity).
func vmIdentity(ctx context.Context, s store.Store, source netip.Addr) (string, error) {
	if !vnatloc.Tenant.Contains(source) {
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
// its vifs (docs/vnat-location.md). sender may speak for source only if
// the intent places a VM with address source on a host one of whose fabric
// addresses (its intent record's, or an uplink its agent reported) is
// sender: no host can store locations for another host's VMs, and nobody
// else can relay at all.
func relayAllowed(ctx context.Context, s store.Store, sender, source netip.Addr) (bool, error) {
	vms, _, err := store.ListJSON[intent.VM](ctx, s, intent.VMsPrefix)
	if err != nil {
		return false, err
	}
	host := ""
	for _, v := range vms {
		if v.IP == source.String() {
			host = v.Host
		}
	}
	if host == "" {
		return false, nil
	}
	var h intent.Host
	if err := store.GetJSON(ctx, s, intent.HostsPrefix+host, &h); err == nil && h.Address == sender.String() {
		return true, nil
	} else if err != nil && !errors.Is(err, store.ErrNotFound) {
		return false, err
	}
	var n intent.Node
	if err := store.GetJSON(ctx, s, intent.NodesPrefix+host, &n); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return false, nil
		}
		return false, err
	}
	if n.UplinkIP == sender.String() {
		return true, nil
	}
	for _, u := range n.Uplinks {
		if u.IP == sender.String() {
			return true, nil
		}
	}
	return false, nil
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
