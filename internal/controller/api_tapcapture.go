package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/tapwire"
)

// MaxCaptureDuration bounds one capture: a capture left running copies
// every matching packet to the controller.
const MaxCaptureDuration = time.Hour

// captureTap serves onehop tap capture (GET /v1/taps/{name}/capture): a
// policy's copies, as a pcap stream, while the request lasts.
//
// The controller is the capture's collector: while the request runs, a
// capture record (intent.TapCapturesPrefix) makes the hosts of the
// policy's senders copy what it matches, ERSPAN II with the policy's id as
// session, to the controller's own address on the fabric, paced by the
// same per-target share as every copy. The controller reads them on a raw
// GRE socket, takes those from a host's uplink address with the policy's
// session, and writes the inner frames to the response. When the request
// ends (count or duration reached, the client gone or killed) the record
// is deleted, and the hosts drop the rules at the next compile.
func (c *Controller) captureTap(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	name := r.PathValue("name")
	q := r.URL.Query()
	count, duration, err := captureArgs(q.Get("count"), q.Get("duration"))
	if err != nil {
		reply(w, http.StatusBadRequest, nil, err)
		return
	}
	p, err := c.getTap(ctx, name)
	if err != nil {
		reply(w, http.StatusNotFound, nil, err)
		return
	}
	// A capture reads the copies: a tenant may capture only what it may
	// copy, its own farm's traffic (scopeTap).
	if err := authorizeTap(ctx, p); err != nil {
		reply(w, http.StatusOK, nil, err)
		return
	}
	hosts, self, err := c.captureAddrs(ctx)
	if err != nil {
		reply(w, http.StatusConflict, nil, err)
		return
	}
	conn, err := net.ListenPacket("ip4:gre", self.String())
	if err != nil {
		reply(w, http.StatusInternalServerError, nil, fmt.Errorf("capture of tap %s: listen for GRE on %s (the controller needs CAP_NET_RAW): %w", name, self, err))
		return
	}
	defer conn.Close()
	if err := c.startCapture(ctx, name, self); err != nil {
		reply(w, http.StatusConflict, nil, err)
		return
	}
	defer c.stopCapture(name)
	c.log.Info("tap capture started", "tap", name, "collector", self, "count", count, "duration", duration)

	if duration == 0 || duration > MaxCaptureDuration {
		duration = MaxCaptureDuration
	}
	ctx, cancel := context.WithTimeout(ctx, duration)
	defer cancel()
	go func() {
		<-ctx.Done()
		conn.SetReadDeadline(time.Now()) // wakes the read below
	}()
	w.Header().Set("Content-Type", tapwire.ContentType)
	w.WriteHeader(http.StatusOK)
	out := tapwire.NewPcapWriter(w)
	rc := http.NewResponseController(w)
	if err := out.Header(); err != nil {
		return
	}
	rc.Flush()
	session := tapwire.Session(p.ID)
	buf := make([]byte, 65536)
	n := 0
	for count == 0 || n < count {
		m, from, err := conn.ReadFrom(buf)
		if err != nil {
			break // the deadline (ctx done), or the socket closed
		}
		src, ok := netip.AddrFromSlice(from.(*net.IPAddr).IP)
		if !ok || !hosts[src.Unmap()] {
			continue // only hosts' copies: anyone on the fabric can send GRE
		}
		frame, s, ok := tapwire.Decap(buf[:m])
		if !ok || s != session {
			continue
		}
		if err := out.Packet(time.Now(), frame); err != nil {
			break // the client is gone
		}
		rc.Flush()
		n++
	}
	c.log.Info("tap capture ended", "tap", name, "packets", n)
}

// captureArgs reads a capture's count (packets, 0: no limit) and duration
// (0: MaxCaptureDuration).
func captureArgs(count, duration string) (int, time.Duration, error) {
	n, d := 0, time.Duration(0)
	if count != "" {
		v, err := strconv.Atoi(count)
		if err != nil || v < 0 {
			return 0, 0, fieldErr("count", fmt.Errorf("count %q: want a number of packets, 0 or more", count))
		}
		n = v
	}
	if duration != "" {
		v, err := time.ParseDuration(duration)
		if err != nil || v < 0 || v > MaxCaptureDuration {
			return 0, 0, fieldErr("duration", fmt.Errorf("duration %q: want a Go duration (30s, 5m) up to %s", duration, MaxCaptureDuration))
		}
		d = v
	}
	return n, d, nil
}

// captureAddrs are the hosts' uplink addresses (the copies come from
// them) and the controller's own address towards them, where they send
// the copies.
func (c *Controller) captureAddrs(ctx context.Context) (map[netip.Addr]bool, netip.Addr, error) {
	nodes, _, err := store.ListJSON[intent.Node](ctx, c.store, intent.NodesPrefix)
	if err != nil {
		return nil, netip.Addr{}, err
	}
	hosts := map[netip.Addr]bool{}
	var first netip.Addr
	for _, n := range nodes {
		ips := []string{n.UplinkIP}
		for _, u := range n.Uplinks {
			ips = append(ips, u.IP)
		}
		for _, s := range ips {
			if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
				hosts[a] = true
				if !first.IsValid() {
					first = a
				}
			}
		}
	}
	if !first.IsValid() {
		return nil, netip.Addr{}, fieldErr("name", errors.New("no host has reported its uplink address yet: nothing would send the copies"))
	}
	// The address the route to a host leaves from (a UDP "connect" sends
	// nothing).
	probe, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(first, 9)))
	if err != nil {
		return nil, netip.Addr{}, fmt.Errorf("capture: no route from the controller to host address %s: %w", first, err)
	}
	defer probe.Close()
	self := probe.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
	return hosts, self, nil
}

// startCapture stores the capture record of tap name, unless one is there
// (one capture of a policy at a time).
func (c *Controller) startCapture(ctx context.Context, name string, self netip.Addr) error {
	key := intent.TapCapturesPrefix + name
	b, err := json.Marshal(intent.TapCaptureRecord{Policy: name, Collector: self.String()})
	if err != nil {
		return err
	}
	_, rev, err := c.store.List(ctx, intent.TapCapturesPrefix+name)
	if err != nil {
		return err
	}
	if old, err := c.store.Get(ctx, key); err == nil {
		return conflict("name", "tap %s is being captured already (%s): one capture of a policy at a time", name, old)
	}
	ok, err := c.store.PutIfUnchanged(ctx, intent.TapCapturesPrefix+name, rev, key, b)
	if err != nil {
		return err
	}
	if !ok {
		return conflict("name", "tap %s is being captured already: one capture of a policy at a time", name)
	}
	return nil
}

// stopCapture deletes the capture record, even when the request's
// context is gone: the hosts stop copying to the controller.
func (c *Controller) stopCapture(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.store.Delete(ctx, intent.TapCapturesPrefix+name); err != nil && !errors.Is(err, store.ErrNotFound) {
		c.log.Warn("tap capture: delete its record; the hosts go on copying to the controller until it is deleted", "tap", name, "err", err)
	}
}

// ClearCaptures removes every capture record and returns the taps they
// named. The daemon calls it at start, before it serves the API, so none
// of its own captures can be running yet.
//
// A record found then is a dead capture's: a capture lives only as long
// as the request of the controller serving it (the GRE socket it reads
// and the response it writes are that process's), so once that controller
// has died no one reads the copies its record still has the hosts send.
// That it can only be this controller's, dead, rests on the design: a
// cloud has one controller, the one writer of intent and desired state
// (docs/control-plane.md, Limits; the daemon compacts an external etcd as
// its only writer). A second controller on the same etcd, which the design
// does not have, would lose its running captures here (its hosts stop
// copying to it), hence a warning naming each record removed.
func (c *Controller) ClearCaptures(ctx context.Context) ([]string, error) {
	var gone []string
	err := c.clearRecords(ctx, intent.TapCapturesPrefix, "capture", func(k string, v []byte) {
		name := strings.TrimPrefix(k, intent.TapCapturesPrefix)
		c.log.Warn("tap capture: removed the record of a capture whose controller stopped mid-capture; its hosts stop copying to it", "tap", name, "record", string(v))
		gone = append(gone, name)
	})
	return gone, err
}

// clearRecords deletes every record under prefix (what names them in an
// error), in key order, telling deleted of each: by key, not by what a
// record says, so one that does not decode goes too.
func (c *Controller) clearRecords(ctx context.Context, prefix, what string, deleted func(key string, value []byte)) error {
	kvs, _, err := c.raw.List(ctx, prefix)
	if err != nil {
		return fmt.Errorf("list %s records: %w", what, err)
	}
	for _, k := range slices.Sorted(maps.Keys(kvs)) {
		if err := c.store.Delete(ctx, k); err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("delete %s record %s: %w", what, k, err)
		}
		deleted(k, kvs[k])
	}
	return nil
}
