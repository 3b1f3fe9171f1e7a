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
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ipam"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/trace"
)

// traceRoutes serves `onehop trace`: what the datapath would do with a
// packet, asked of the hosts on its path (docs/troubleshooting.md).
func (c *Controller) traceRoutes(mux *router) {
	mux.HandleFunc("GET /v1/trace", func(w http.ResponseWriter, r *http.Request) {
		req, err := traceQuery(r.URL.Query())
		var rep trace.Report
		if err == nil {
			rep, err = c.Trace(r.Context(), req)
		}
		reply(w, http.StatusOK, rep, err)
	})
}

// traceQuery reads GET /v1/trace's query; errors name the parameter.
func traceQuery(q url.Values) (trace.Request, error) {
	req := trace.Request{From: q.Get("from"), To: q.Get("to"), Proto: q.Get("proto"), Flags: q.Get("flags"), SrcIP: q.Get("src-ip")}
	for _, p := range []struct {
		field string
		v     *uint16
	}{{"sport", &req.Sport}, {"dport", &req.Dport}} {
		if s := q.Get(p.field); s != "" {
			n, err := strconv.ParseUint(s, 10, 16)
			if err != nil || n == 0 {
				return req, fieldErr(p.field, fmt.Errorf("port %q: want 1-65535", s))
			}
			*p.v = uint16(n)
		}
	}
	return req, nil
}

// TraceTimeout bounds how long the controller waits for a host's agent to
// answer a trace.
const TraceTimeout = 5 * time.Second

// Trace says what the datapath would do with the packet req describes:
// the sending host's vif program, then, if it sends the packet to another
// host, that host's uplink program on the frame as it would arrive. Each
// runs on its host, against that host's live maps, and changes nothing
// there. A tenant traces from and to its own farm's VMs only.
func (c *Controller) Trace(ctx context.Context, req trace.Request) (trace.Report, error) {
	rep, in, err := c.resolveTrace(ctx, req)
	if err != nil {
		return rep, err
	}
	req = rep.Request
	switch rep.From.Kind {
	case trace.KindSliver:
		err = c.traceFromSliver(ctx, in, req, &rep)
	case trace.KindExternal:
		err = c.traceFromExternal(ctx, in, req, &rep)
	default:
		err = c.traceFromVM(ctx, in, req, &rep)
	}
	if err != nil {
		return rep, err
	}
	rep.Finish()
	return rep, nil
}

// resolveTrace checks req and resolves its ends against the intent, as
// the caller may see them: everything of a trace but asking the hosts.
func (c *Controller) resolveTrace(ctx context.Context, req trace.Request) (trace.Report, trace.Intent, error) {
	var rep trace.Report
	var in trace.Intent
	req, err := req.Normalize()
	var bad *trace.Invalid
	if errors.As(err, &bad) {
		return rep, in, fieldErr(bad.Field, bad)
	} else if err != nil {
		return rep, in, err
	}
	rep.Request = req
	if in.Farms, _, err = store.ListJSON[intent.Farm](ctx, c.store, intent.FarmsPrefix); err != nil {
		return rep, in, err
	}
	if in.Subnets, _, err = store.ListJSON[intent.Subnet](ctx, c.store, intent.SubnetsPrefix); err != nil {
		return rep, in, err
	}
	if in.Nodes, _, err = store.ListJSON[intent.Node](ctx, c.store, intent.NodesPrefix); err != nil {
		return rep, in, err
	}
	vms, _, err := store.ListJSON[intent.VM](ctx, c.store, intent.VMsPrefix)
	if err != nil {
		return rep, in, err
	}
	if rep.From, err = c.traceEnd(ctx, "from", req.From, vms, in); err != nil {
		return rep, in, err
	}
	if rep.From.Kind == trace.KindAddress || rep.From.Kind == trace.KindHost {
		return rep, in, fieldErr("from", fmt.Errorf("%s is no VM's, sliver's or external address: a trace starts at a VM (farm/subnet/vm), a sliver (host/sliver) or an address outside the tenant space and the hosts", req.From))
	}
	if rep.To, err = c.traceEnd(ctx, "to", req.To, vms, in); err != nil {
		return rep, in, err
	}
	for _, e := range []struct {
		field string
		end   trace.Endpoint
	}{{"from", rep.From}, {"to", rep.To}} {
		if a, err := netip.ParseAddr(e.end.IP); err != nil || !a.Is4() {
			return rep, in, fieldErr(e.field, fmt.Errorf("%s has no IPv4 address yet", e.end.Name))
		}
	}
	if err := traceAuthorized(IdentityOf(ctx), rep.From, rep.To); err != nil {
		return rep, in, err
	}
	return rep, in, nil
}

// traceAuthorized: a tenant traces from and to its own farm's VMs (from an
// external to its own VM too); slivers and hosts' addresses belong to no
// farm, so only an administrator traces them.
func traceAuthorized(id Identity, from, to trace.Endpoint) error {
	if id.Admin() {
		return nil
	}
	for _, e := range []struct {
		field string
		end   trace.Endpoint
	}{{"from", from}, {"to", to}} {
		switch e.end.Kind {
		case trace.KindVM:
			if err := mayActOn(id, e.field, e.end.VM.Farm); err != nil {
				return err
			}
		case trace.KindSliver, trace.KindHost:
			return forbidden(e.field, id, "%s is %s: slivers and hosts belong to no farm; an administrator traces them", e.end.IP, e.end.Name)
		}
	}
	if from.Kind == trace.KindExternal && to.Kind != trace.KindVM {
		return forbidden("to", id, "a tenant traces from an external to its own farm's VMs only")
	}
	if from.Kind == trace.KindVM && to.Kind != trace.KindVM && !sameFarmAddr(from.IP, to.IP) {
		return forbidden("to", id, "a tenant traces within its own farm (farm %s); %s is outside it", id.Farm, to.IP)
	}
	return nil
}

// traceFromVM: the sending host's vif program, then, if it sends the
// packet to another host, that host's uplink program.
func (c *Controller) traceFromVM(ctx context.Context, in trace.Intent, req trace.Request, rep *trace.Report) error {
	src, dst := netip.MustParseAddr(rep.From.IP), netip.MustParseAddr(rep.To.IP)
	if req.SrcIP != "" {
		src = netip.MustParseAddr(req.SrcIP) // checked by Normalize
	}
	srcMAC, err := net.ParseMAC(rep.From.VM.MAC)
	if err != nil {
		return fmt.Errorf("vm %s: MAC %q: %w", rep.From.Name, rep.From.VM.MAC, err)
	}
	// What the VM's stack puts on the wire: to the destination's MAC in
	// its subnet, to its gateway's otherwise.
	dstMAC := ipam.VirtualMAC(dst)
	if gw, err := netip.ParseAddr(rep.From.VM.Gateway); err == nil && !sameSubnetAddr(src, dst) {
		dstMAC = ipam.VirtualMAC(gw)
	}
	frame, err := trace.Frame(req, src, dst, srcMAC, dstMAC)
	if err != nil {
		return fieldErr("to", err)
	}
	return c.traceHops(ctx, in, req, rep, rep.From.Host, trace.AgentRequest{Program: trace.ProgramVif, Src: rep.From.IP, Frame: frame})
}

// traceFromSliver: port space's program on the sliver's link, then, if it
// sends the frame to another host's uplink, that host's uplink program.
// The sliver's frame is from its host's address and MAC; to a host's
// address it goes to that host's MAC, to anything else to the fabric's
// next hop, which the intent does not know (ExternalMAC stands for it).
func (c *Controller) traceFromSliver(ctx context.Context, in trace.Intent, req trace.Request, rep *trace.Report) error {
	src := netip.MustParseAddr(rep.From.IP)
	if req.SrcIP != "" {
		src = netip.MustParseAddr(req.SrcIP)
	}
	_, mac, _ := in.Uplink(rep.From.Host, rep.From.Uplink)
	srcMAC, err := net.ParseMAC(mac)
	if err != nil {
		return fmt.Errorf("host %s: uplink %d's MAC %q: %w", rep.From.Host, rep.From.Uplink, mac, err)
	}
	dstMAC := trace.ExternalMAC
	if host, idx := in.UplinkOfIP(rep.To.IP); host != "" {
		_, m, _ := in.Uplink(host, idx)
		if dstMAC, err = net.ParseMAC(m); err != nil {
			return fmt.Errorf("host %s: uplink %d's MAC %q: %w", host, idx, m, err)
		}
	}
	frame, err := trace.Frame(req, src, netip.MustParseAddr(rep.To.IP), srcMAC, dstMAC)
	if err != nil {
		return fieldErr("to", err)
	}
	return c.traceHops(ctx, in, req, rep, rep.From.Host, trace.AgentRequest{Program: trace.ProgramSliver, Sliver: rep.From.Sliver.Slot, Uplink: rep.From.Uplink, Frame: frame})
}

// traceFromExternal: the uplink program of TO's host, on the frame as it
// arrives from outside onehop (ExternalMAC, to the host's uplink MAC): a
// reply to a VM's egress flow or to a sliver, or anything sent to a VM's
// or host's address.
func (c *Controller) traceFromExternal(ctx context.Context, in trace.Intent, req trace.Request, rep *trace.Report) error {
	if rep.To.Host == "" {
		return fieldErr("to", fmt.Errorf("%s: from an external, trace to a VM, a sliver or a host's address (the frame arrives on that host's uplink)", rep.To.IP))
	}
	_, mac, ok := in.Uplink(rep.To.Host, rep.To.Uplink)
	dstMAC, err := net.ParseMAC(mac)
	if !ok || err != nil {
		return fmt.Errorf("host %s: uplink %d has no MAC in the intent (%q)", rep.To.Host, rep.To.Uplink, mac)
	}
	src := netip.MustParseAddr(rep.From.IP)
	if req.SrcIP != "" {
		src = netip.MustParseAddr(req.SrcIP)
	}
	frame, err := trace.Frame(req, src, netip.MustParseAddr(rep.To.IP), trace.ExternalMAC, dstMAC)
	if err != nil {
		return fieldErr("to", err)
	}
	run, err := c.askAgent(ctx, rep.To.Host, trace.AgentRequest{Program: trace.ProgramUplink, Uplink: rep.To.Uplink, Frame: frame})
	if err != nil {
		return err
	}
	rep.Hops = append(rep.Hops, in.Explain(rep.To.Host, run, req, rep.From, rep.To))
	return nil
}

// traceHops runs first on host and, when it sends the frame to another
// host's uplink, that host's uplink program on the frame as it arrives.
func (c *Controller) traceHops(ctx context.Context, in trace.Intent, req trace.Request, rep *trace.Report, host string, first trace.AgentRequest) error {
	run, err := c.askAgent(ctx, host, first)
	if err != nil {
		return err
	}
	hop := in.Explain(host, run, req, rep.From, rep.To)
	rep.Hops = append(rep.Hops, hop)
	if next := hop.NextHost; next != "" && run.Drop == "" && len(run.Out) >= 6 {
		_, idx := in.UplinkOfMAC(net.HardwareAddr(run.Out[:6]))
		run, err := c.askAgent(ctx, next, trace.AgentRequest{Program: trace.ProgramUplink, Uplink: idx, Frame: run.Out})
		if err != nil {
			return err
		}
		rep.Hops = append(rep.Hops, in.Explain(next, run, req, rep.From, rep.To))
	}
	return nil
}

// traceEnd resolves one end of a trace: a VM by farm/subnet/vm, a sliver
// by host/sliver, or an address: a VM's, a host's, one in the tenant
// space no VM holds, or an external.
func (c *Controller) traceEnd(ctx context.Context, field, s string, vms []intent.VM, in trace.Intent) (trace.Endpoint, error) {
	switch parts := strings.Split(s, "/"); len(parts) {
	case 3:
		v, err := c.getVM(ctx, parts[0], parts[1], parts[2])
		if err != nil {
			return trace.Endpoint{}, fieldErr(field, err)
		}
		return vmEnd(v), nil
	case 2:
		sl, _, err := c.getSliver(ctx, parts[0], parts[1])
		if err != nil {
			return trace.Endpoint{}, fieldErr(field, err)
		}
		e := trace.Endpoint{Kind: trace.KindSliver, Name: sl.FullName(), Host: sl.Host, Sliver: &sl}
		if ups := sl.Uplinks(); len(ups) > 0 {
			e.Uplink = ups[0]
		}
		ip, _, ok := in.Uplink(sl.Host, e.Uplink)
		if !ok || ip == "" {
			return trace.Endpoint{}, fieldErr(field, fmt.Errorf("sliver %s: its host has no address on uplink %d yet (is its agent up?)", sl.FullName(), e.Uplink))
		}
		e.IP = ip
		return e, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return trace.Endpoint{}, fieldErr(field, fmt.Errorf("%q: want a VM (farm/subnet/vm), a sliver (host/sliver) or an IPv4 address", s))
	}
	// A broadcast's copies are sent the moment the program makes them:
	// the trace instance makes none, so it could not follow them.
	plan := addrplan.Current()
	if farm, subnet, _, ok := plan.Split(a); a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) || ok && a == plan.Broadcast(farm, subnet) {
		return trace.Endpoint{}, fieldErr(field, fmt.Errorf("%s: broadcast and multicast are not traced; trace to one of the VMs instead", a))
	}
	for i := range vms {
		if vms[i].IP == a.String() {
			return vmEnd(vms[i]), nil
		}
	}
	if host, idx := in.UplinkOfIP(a.String()); host != "" {
		return trace.Endpoint{Kind: trace.KindHost, Name: host, IP: a.String(), Host: host, Uplink: idx}, nil
	}
	if _, ok := plan.FarmOf(a); ok {
		return trace.Endpoint{Kind: trace.KindAddress, IP: a.String()}, nil
	}
	return trace.Endpoint{Kind: trace.KindExternal, IP: a.String()}, nil
}

func vmEnd(v intent.VM) trace.Endpoint {
	return trace.Endpoint{Kind: trace.KindVM, Name: v.FullName(), IP: v.IP, Host: v.Host, VM: &v}
}

// sameSubnetAddr says whether a and b are in one subnet of the plan.
func sameSubnetAddr(a, b netip.Addr) bool {
	p := addrplan.Current()
	fa, sa, _, oka := p.Split(a)
	fb, sb, _, okb := p.Split(b)
	return oka && okb && fa == fb && sa == sb
}

// sameFarmAddr says whether a and b are in one farm of the plan.
func sameFarmAddr(a, b string) bool {
	p := addrplan.Current()
	fa, oka := p.FarmOf(netip.MustParseAddr(a))
	fb, okb := p.FarmOf(netip.MustParseAddr(b))
	return oka && okb && fa == fb
}

// askAgent has host's agent run req and waits for its answer (through the
// store: intent.TraceRequestsPrefix, intent.TraceReplyKey).
func (c *Controller) askAgent(ctx context.Context, host string, req trace.AgentRequest) (trace.Run, error) {
	ctx, cancel := context.WithTimeout(ctx, TraceTimeout)
	defer cancel()
	var b [8]byte
	rand.Read(b[:])
	req.ID = hex.EncodeToString(b[:])
	replyKey := intent.TraceReplyKey(host)
	_, rev, err := c.raw.List(ctx, replyKey)
	if err != nil {
		return trace.Run{}, fmt.Errorf("trace on host %s: %w", host, err)
	}
	// Watched before the request is written, so no answer is missed.
	events := c.raw.WatchEvents(ctx, replyKey, rev)
	if err := store.PutJSON(ctx, c.raw, intent.TraceRequestKey(host), req); err != nil {
		return trace.Run{}, fmt.Errorf("trace on host %s: %w", host, err)
	}
	for batch := range events {
		if batch.Err != nil {
			return trace.Run{}, fmt.Errorf("trace on host %s: watch: %w", host, batch.Err)
		}
		for _, ev := range batch.Events {
			var rep trace.AgentReply
			if ev.Key != replyKey || ev.Deleted || json.Unmarshal(ev.Value, &rep) != nil || rep.ID != req.ID {
				continue
			}
			if rep.Error != "" {
				return trace.Run{}, errors.New(rep.Error)
			}
			if rep.Run == nil {
				return trace.Run{}, fmt.Errorf("trace on host %s: an empty answer", host)
			}
			return *rep.Run, nil
		}
	}
	if ctx.Err() != nil {
		return trace.Run{}, fmt.Errorf("trace on host %s: its agent did not answer within %s (is it running?)", host, TraceTimeout)
	}
	return trace.Run{}, fmt.Errorf("trace on host %s: the watch ended", host)
}
