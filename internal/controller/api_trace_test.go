package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ipam"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/trace"
)

// fakeTraceAgent answers host's trace requests in s as answer says, and
// sends each request it saw on seen. It stops with ctx.
func fakeTraceAgent(ctx context.Context, t *testing.T, s store.Store, host string, answer func(trace.AgentRequest) trace.AgentReply, seen chan<- trace.AgentRequest) {
	prefix := intent.TraceRequestsPrefix + host + "/"
	_, rev, err := s.List(ctx, prefix)
	if err != nil {
		t.Error(err)
		return
	}
	events := s.WatchEvents(ctx, prefix, rev)
	go func() {
		for b := range events {
			for _, ev := range b.Events {
				if ev.Deleted {
					continue
				}
				var req trace.AgentRequest
				if err := json.Unmarshal(ev.Value, &req); err != nil {
					t.Error(err)
					continue
				}
				seen <- req
				rep := answer(req)
				rep.ID, rep.Node = req.ID, host
				if err := store.PutJSON(ctx, s, intent.TraceReplyKey(host), rep); err != nil && ctx.Err() == nil {
					t.Error(err)
				}
			}
		}
	}()
}

// The controller crafts the frame the VM would send (to its gateway's MAC
// for another subnet), asks the sending host, follows the frame to the
// host whose uplink MAC it leaves for, asks that host's uplink program
// with the frame as it left. A tenant traces
// its own farm only; a host that does not answer is named.
func TestTraceAsksTheHostsOnThePathAndFollowsTheFrame(t *testing.T) {
	c, s := newController()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := c.ApplyTopology(ctx, parse(t, topo)); err != nil {
		t.Fatal(err)
	}
	h2MAC := net.HardwareAddr{0xaa, 0, 0, 0, 0, 2}
	for _, n := range []intent.Node{{Name: "h1", UplinkMAC: "aa:00:00:00:00:01"}, {Name: "h2", UplinkMAC: h2MAC.String()}} {
		if err := store.PutJSON(ctx, s, intent.NodesPrefix+n.Name, n); err != nil {
			t.Fatal(err)
		}
	}
	leaving := append(append(net.HardwareAddr{}, h2MAC...), 0xaa, 0, 0, 0, 0, 1, 8, 0)
	seen1, seen2 := make(chan trace.AgentRequest, 4), make(chan trace.AgentRequest, 4)
	fakeTraceAgent(ctx, t, s, "h1", func(trace.AgentRequest) trace.AgentReply {
		return trace.AgentReply{Run: &trace.Run{Program: "vif", Verdict: "redirect", Forwards: []string{"to_fabric"}, To: 2, ToKind: "out", Out: leaving}}
	}, seen1)
	fakeTraceAgent(ctx, t, s, "h2", func(trace.AgentRequest) trace.AgentReply {
		return trace.AgentReply{Run: &trace.Run{Program: "uplink", Verdict: "redirect", Forwards: []string{"from_fabric"}, To: 4, ToKind: "peer"}}
	}, seen2)

	rep, err := c.Trace(ctx, trace.Request{From: "blue/web/web1", To: "10.1.2.2", Dport: 5432})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Verdict != "delivered" || len(rep.Hops) != 2 || rep.Hops[0].NextHost != "h2" || rep.To.Name != "blue/db/db1" {
		t.Fatalf("report: %+v", rep)
	}
	r1, r2 := <-seen1, <-seen2
	if r1.Program != trace.ProgramVif || r1.Src != "10.1.1.2" || !bytes.Equal(r1.Frame[:6], ipam.VirtualMAC(netip.MustParseAddr("10.1.1.1"))) {
		t.Errorf("h1 was asked %s from %s with a frame to %x, want vif from 10.1.1.2 to the gateway's MAC", r1.Program, r1.Src, r1.Frame[:6])
	}
	if r2.Program != trace.ProgramUplink || !bytes.Equal(r2.Frame, leaving) {
		t.Errorf("h2 was asked %s with %x, want uplink with the frame as it left h1", r2.Program, r2.Frame)
	}
	if kv, _, _ := s.List(ctx, intent.TraceRequestsPrefix); len(kv) != 2 {
		t.Errorf("requests in the store: %v, want one key per host asked", kv)
	}

	// A tenant of another farm may not trace blue's VMs.
	red := WithIdentity(ctx, Identity{Farm: "red", Via: "tenant-token"})
	if _, err := c.Trace(red, trace.Request{From: "blue/web/web1", To: "blue/db/db1", Dport: 1}); !errors.Is(err, ErrForbidden) {
		t.Errorf("red tracing blue: %v, want forbidden", err)
	}
	// Bad input names its field.
	for req, want := range map[trace.Request]string{
		{From: "blue/web/nope", To: "10.1.2.2", Dport: 1}:   "vm blue/web/nope: not found",
		{From: "10.9.9.9", To: "10.1.2.2", Dport: 1}:        "from: 10.9.9.9 is no VM's, sliver's or external address",
		{From: "blue/web/web1", To: "10.1.1.255", Dport: 1}: "broadcast and multicast are not traced",
		{From: "blue/web/web1", To: "10.1.2.2"}:             "dport: required",
	} {
		if _, err := c.Trace(ctx, req); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want an error saying %q", req, err, want)
		}
	}
	// A host whose agent does not answer is named.
	short, stop := context.WithTimeout(ctx, 200*time.Millisecond)
	defer stop()
	if _, err := c.askAgent(short, "h3", trace.AgentRequest{Program: trace.ProgramVif}); err == nil || !strings.Contains(err.Error(), "host h3") {
		t.Errorf("a host without an agent: %v, want an error naming h3", err)
	}
}

// From a sliver the controller asks its host's port-space program, with
// the sliver's slot and uplink and a frame from the host's address and
// MAC; one to another host's address follows to that host's uplink. From
// an external the frame arrives on TO's host's uplink, from no host's MAC.
// Slivers belong to no farm: a tenant may not trace them.
func TestTraceFromASliverAndFromAnExternalAsksTheRightPrograms(t *testing.T) {
	c, s := newController()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := c.ApplyTopology(ctx, parse(t, topo)); err != nil {
		t.Fatal(err)
	}
	h1MAC, h2MAC := net.HardwareAddr{0xaa, 0, 0, 0, 0, 1}, net.HardwareAddr{0xaa, 0, 0, 0, 0, 2}
	for _, n := range []intent.Node{
		{Name: "h1", UplinkMAC: h1MAC.String(), UplinkIP: "192.168.100.10"},
		{Name: "h2", UplinkMAC: h2MAC.String(), UplinkIP: "192.168.100.11"},
	} {
		if err := store.PutJSON(ctx, s, intent.NodesPrefix+n.Name, n); err != nil {
			t.Fatal(err)
		}
	}
	sl := intent.Sliver{Host: "h1", Name: "s1", Slot: 3, Leases: []intent.Lease{{Lo: 10000, Hi: 10099}}}
	if err := store.PutJSON(ctx, s, intent.SliverKey("h1", "s1"), sl); err != nil {
		t.Fatal(err)
	}
	seen1, seen2 := make(chan trace.AgentRequest, 4), make(chan trace.AgentRequest, 4)
	fakeTraceAgent(ctx, t, s, "h1", func(r trace.AgentRequest) trace.AgentReply {
		if r.Program == trace.ProgramSliver {
			return trace.AgentReply{Run: &trace.Run{Program: "sliver", Verdict: "redirect", Forwards: []string{"from_sliver"}, To: 2, ToKind: "out", Out: r.Frame}}
		}
		return trace.AgentReply{Run: &trace.Run{Program: "uplink", Verdict: "redirect", Forwards: []string{"to_sliver"}, To: 9, ToKind: "peer"}}
	}, seen1)
	fakeTraceAgent(ctx, t, s, "h2", func(trace.AgentRequest) trace.AgentReply {
		return trace.AgentReply{Run: &trace.Run{Program: "uplink", Verdict: "pass", Forwards: []string{"host_stack"}}}
	}, seen2)

	rep, err := c.Trace(ctx, trace.Request{From: "h1/s1", To: "192.168.100.11", Sport: 10001, Dport: 80})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Verdict != "to host stack" || len(rep.Hops) != 2 || rep.Hops[0].NextHost != "h2" || rep.From.Kind != trace.KindSliver || rep.To.Kind != trace.KindHost {
		t.Fatalf("sliver to h2's address: %+v", rep)
	}
	r1, r2 := <-seen1, <-seen2
	if r1.Program != trace.ProgramSliver || r1.Sliver != 3 || !bytes.Equal(r1.Frame[:12], append(append(net.HardwareAddr{}, h2MAC...), h1MAC...)) {
		t.Errorf("h1 was asked %s for slot %d with a frame %x, want the sliver program for slot 3, h1's MAC to h2's", r1.Program, r1.Sliver, r1.Frame[:12])
	}
	if r2.Program != trace.ProgramUplink || !bytes.Equal(r2.Frame, r1.Frame) {
		t.Errorf("h2 was asked %s with %x, want its uplink with the sliver's frame", r2.Program, r2.Frame)
	}

	rep, err = c.Trace(ctx, trace.Request{From: "203.0.113.7", To: "h1/s1", Sport: 443, Dport: 10001})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Verdict != "delivered" || len(rep.Hops) != 1 || rep.Hops[0].Host != "h1" || rep.From.Kind != trace.KindExternal || rep.To.IP != "192.168.100.10" {
		t.Fatalf("external to s1: %+v", rep)
	}
	if r := <-seen1; r.Program != trace.ProgramUplink || !bytes.Equal(r.Frame[:12], append(append(net.HardwareAddr{}, h1MAC...), trace.ExternalMAC...)) {
		t.Errorf("h1 was asked %s with a frame %x, want its uplink with a frame from the external's MAC to h1's", r.Program, r.Frame[:12])
	}

	blue := WithIdentity(ctx, Identity{Farm: "blue", Via: "tenant-token"})
	for _, req := range []trace.Request{{From: "h1/s1", To: "blue/web/web1", Dport: 1}, {From: "blue/web/web1", To: "h1/s1", Dport: 1}, {From: "203.0.113.7", To: "192.168.100.10", Dport: 1}} {
		if _, err := c.Trace(blue, req); !errors.Is(err, ErrForbidden) {
			t.Errorf("a tenant tracing %s -> %s: %v, want forbidden", req.From, req.To, err)
		}
	}
	for req, want := range map[trace.Request]string{
		{From: "h1/nope", To: "blue/web/web1", Dport: 1}:        "sliver h1/nope",
		{From: "192.168.100.10", To: "blue/web/web1", Dport: 1}: "from: 192.168.100.10 is no VM's, sliver's or external address",
		{From: "203.0.113.7", To: "198.51.100.1", Dport: 1}:     "to: 198.51.100.1: from an external, trace to a VM, a sliver or a host's address",
	} {
		if _, err := c.Trace(ctx, req); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want an error saying %q", req, err, want)
		}
	}
}
