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
		q := r.URL.Query()
		req := trace.Request{From: q.Get("from"), To: q.Get("to"), Proto: q.Get("proto"), Flags: q.Get("flags"), SrcIP: q.Get("src-ip")}
		var err error
		for _, p := range []struct {
			field string
			v     *uint16
		}{{"sport", &req.Sport}, {"dport", &req.Dport}} {
			if s := q.Get(p.field); s != "" && err == nil {
				n, perr := strconv.ParseUint(s, 10, 16)
				if perr != nil || n == 0 {
					err = fieldErr(p.field, fmt.Errorf("port %q: want 1-65535", s))
				}
				*p.v = uint16(n)
			}
		}
		var rep trace.Report
		if err == nil {
			rep, err = c.Trace(r.Context(), req)
		}
		reply(w, http.StatusOK, rep, err)
	})
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
	var rep trace.Report
	req, err := req.Normalize()
	if err != nil {
		field, _, _ := strings.Cut(err.Error(), ":")
		return rep, fieldErr(field, errors.New(strings.TrimSpace(strings.TrimPrefix(err.Error(), field+":"))))
	}
	rep.Request = req
	var in trace.Intent
	if in.Farms, _, err = store.ListJSON[intent.Farm](ctx, c.store, intent.FarmsPrefix); err != nil {
		return rep, err
	}
	if in.Subnets, _, err = store.ListJSON[intent.Subnet](ctx, c.store, intent.SubnetsPrefix); err != nil {
		return rep, err
	}
	if in.Nodes, _, err = store.ListJSON[intent.Node](ctx, c.store, intent.NodesPrefix); err != nil {
		return rep, err
	}
	vms, _, err := store.ListJSON[intent.VM](ctx, c.store, intent.VMsPrefix)
	if err != nil {
		return rep, err
	}
	if rep.From, err = c.traceEnd(ctx, "from", req.From, vms); err != nil {
		return rep, err
	}
	if rep.From.VM == nil {
		return rep, fieldErr("from", fmt.Errorf("%s is no VM's address: a trace starts at a VM (farm/subnet/vm or its address); slivers and externals as FROM are not traced yet", req.From))
	}
	if rep.To, err = c.traceEnd(ctx, "to", req.To, vms); err != nil {
		return rep, err
	}
	id := IdentityOf(ctx)
	if err := mayActOn(id, "from", rep.From.VM.Farm); err != nil {
		return rep, err
	}
	if rep.To.VM != nil {
		if err := mayActOn(id, "to", rep.To.VM.Farm); err != nil {
			return rep, err
		}
	} else if !id.Admin() && !sameFarmAddr(rep.From.IP, rep.To.IP) {
		return rep, forbidden("to", id, "a tenant traces within its own farm (farm %s); %s is outside it", id.Farm, rep.To.IP)
	}

	src, dst := netip.MustParseAddr(rep.From.IP), netip.MustParseAddr(rep.To.IP)
	if req.SrcIP != "" {
		src = netip.MustParseAddr(req.SrcIP) // checked by Normalize
	}
	srcMAC, err := net.ParseMAC(rep.From.VM.MAC)
	if err != nil {
		return rep, fmt.Errorf("vm %s: MAC %q: %w", rep.From.Name, rep.From.VM.MAC, err)
	}
	// What the VM's stack puts on the wire: to the destination's MAC in
	// its subnet, to its gateway's otherwise.
	dstMAC := ipam.VirtualMAC(dst)
	if gw, err := netip.ParseAddr(rep.From.VM.Gateway); err == nil && !sameSubnetAddr(src, dst) {
		dstMAC = ipam.VirtualMAC(gw)
	}
	frame, err := trace.Frame(req, src, dst, srcMAC, dstMAC)
	if err != nil {
		return rep, fieldErr("to", err)
	}

	host := rep.From.Host
	run, err := c.askAgent(ctx, host, trace.AgentRequest{Program: trace.ProgramVif, Src: rep.From.IP, Frame: frame})
	if err != nil {
		return rep, err
	}
	hop := in.Explain(host, run, req, rep.From, rep.To)
	rep.Hops = append(rep.Hops, hop)
	if next := hop.NextHost; next != "" && run.Drop == "" {
		run, err := c.askAgent(ctx, next, trace.AgentRequest{Program: trace.ProgramUplink, Frame: run.Out})
		if err != nil {
			return rep, err
		}
		rep.Hops = append(rep.Hops, in.Explain(next, run, req, rep.From, rep.To))
	}
	rep.Finish()
	return rep, nil
}

// traceEnd resolves one end of a trace: a VM by farm/subnet/vm, or an
// address (a VM's, when one holds it).
func (c *Controller) traceEnd(ctx context.Context, field, s string, vms []intent.VM) (trace.Endpoint, error) {
	if parts := strings.Split(s, "/"); len(parts) == 3 {
		v, err := c.getVM(ctx, parts[0], parts[1], parts[2])
		if err != nil {
			return trace.Endpoint{}, fieldErr(field, err)
		}
		return trace.Endpoint{Name: v.FullName(), IP: v.IP, Host: v.Host, VM: &v}, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return trace.Endpoint{}, fieldErr(field, fmt.Errorf("%q: want a VM (farm/subnet/vm) or an IPv4 address", s))
	}
	// A broadcast's copies are sent the moment the program makes them:
	// the trace instance makes none, so it could not follow them.
	plan := addrplan.Current()
	if farm, subnet, _, ok := plan.Split(a); a.IsMulticast() || ok && a == plan.Broadcast(farm, subnet) {
		return trace.Endpoint{}, fieldErr(field, fmt.Errorf("%s: broadcast and multicast are not traced; trace to one of the VMs instead", a))
	}
	for i := range vms {
		if vms[i].IP == a.String() {
			v := vms[i]
			return trace.Endpoint{Name: v.FullName(), IP: v.IP, Host: v.Host, VM: &v}, nil
		}
	}
	return trace.Endpoint{IP: a.String()}, nil
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
