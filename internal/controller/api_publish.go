package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lease"
	"github.com/onehop/onehop/internal/store"
)

// MaxPublished is how many ports one VM may publish: each takes a port of
// its host's address from every other VM and sliver there.
const MaxPublished = 16

// publishRoutes serves a VM's published ports (docs/north-south.md): a
// tenant publishes its own farm's VMs (scopeFarm), on public ports from
// lease.SliceFloor up; below it are the host's own services, which only
// the operator may give away (port 80 on a host that serves nothing there).
func (c *Controller) publishRoutes(mux *router) {
	mux.HandleFunc("POST /v1/farms/{farm}/subnets/{subnet}/vms/{vm}/publications", func(w http.ResponseWriter, r *http.Request) {
		if err := checkPath(r, "farm", "subnet", "vm"); err != nil {
			reply(w, 0, nil, err)
			return
		}
		var in intent.Publication
		if decode(w, r, &in) {
			v, err := c.PublishVM(r.Context(), r.PathValue("farm"), r.PathValue("subnet"), r.PathValue("vm"), in)
			reply(w, http.StatusCreated, v, err)
		}
	})
	mux.HandleFunc("DELETE /v1/farms/{farm}/subnets/{subnet}/vms/{vm}/publications/{proto}/{port}", func(w http.ResponseWriter, r *http.Request) {
		var v intent.VM
		err := checkPath(r, "farm", "subnet", "vm")
		if err == nil {
			var port uint64
			if port, err = strconv.ParseUint(r.PathValue("port"), 10, 16); err != nil || port == 0 {
				err = fieldErr("port", fmt.Errorf("port %q: want the VM's published port, 1..65535", r.PathValue("port")))
			} else {
				v, err = c.UnpublishVM(r.Context(), r.PathValue("farm"), r.PathValue("subnet"), r.PathValue("vm"), r.PathValue("proto"), uint16(port))
			}
		}
		reply(w, http.StatusOK, v, err)
	})
}

// checkPublication checks p as a caller gives it and returns it in its
// stored form: proto lowercase, a public port of 0 meaning the VM's own.
func checkPublication(p intent.Publication) (intent.Publication, error) {
	p.Proto = strings.ToLower(p.Proto)
	if p.Proto != "tcp" && p.Proto != "udp" {
		return p, fieldErr("proto", fmt.Errorf("proto %q: want tcp or udp", p.Proto))
	}
	if p.Port == 0 {
		return p, fieldErr("port", fmt.Errorf("port 0: want the VM's port, 1..65535"))
	}
	if p.PublicPort == 0 {
		p.PublicPort = p.Port
	}
	return p, nil
}

// PublishVM publishes p of farm/subnet/vm on its host's address: a lease
// of the public port, refused (409) when a sliver's lease, a VM's slice,
// another publication or the host's ephemeral range holds it, naming the
// holder. Publishing the VM's port and protocol again moves it to the new
// public port. Under c.mu, as slices are leased (SetFarmEgress), so no two
// holders are ever given one port.
func (c *Controller) PublishVM(ctx context.Context, farm, subnet, name string, p intent.Publication) (intent.VM, error) {
	p, err := checkPublication(p)
	if err != nil {
		return intent.VM{}, err
	}
	if id := IdentityOf(ctx); !id.Admin() && p.PublicPort < lease.SliceFloor {
		return intent.VM{}, forbidden("publicPort", id, "public port %d is below %d, the host's own services: only the operator publishes there", p.PublicPort, lease.SliceFloor)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	v, err := c.getVM(ctx, farm, subnet, name)
	if err != nil {
		return v, err
	}
	kept := slices.DeleteFunc(slices.Clone(v.Published), func(o intent.Publication) bool { return o.Proto == p.Proto && o.Port == p.Port })
	if len(kept) != len(v.Published) && slices.Contains(v.Published, p) {
		return v, nil // as it is
	}
	if len(kept) >= MaxPublished {
		return v, full("port", fmt.Errorf("vm %s publishes %d ports, the most one VM may (%d): unpublish one first", v.FullName(), len(kept), MaxPublished))
	}
	nv := v
	nv.Published = append(kept, p)
	sortPublished(nv.Published)
	// Decided in the host's lease space and written in one transaction
	// with it (writeLeases), as slivers and slices are.
	err = c.writeLeases(ctx, v.Host, "publication "+p.String()+" of vm "+v.FullName(), func(ls *leaseSpace) ([]store.Op, bool, error) {
		if err := c.checkPublished(ctx, ls, nv); err != nil {
			return nil, false, err
		}
		ls.setPublished(nv.FullName(), nv.Published)
		b, err := json.Marshal(nv)
		if err != nil {
			return nil, false, fmt.Errorf("encode vm %s: %w", nv.FullName(), err)
		}
		return []store.Op{{Key: intent.VMsPrefix + nv.FullName(), Value: b}}, true, nil
	})
	if err != nil {
		return v, err
	}
	c.log.Info("port published", "vm", v.FullName(), "publication", p.String(), "host", v.Host)
	return nv, nil
}

// UnpublishVM takes back farm/subnet/vm's publication of proto port (the
// VM's own port): its public port is the host's again.
func (c *Controller) UnpublishVM(ctx context.Context, farm, subnet, name, proto string, port uint16) (intent.VM, error) {
	proto = strings.ToLower(proto)
	c.mu.Lock()
	defer c.mu.Unlock()
	v, err := c.getVM(ctx, farm, subnet, name)
	if err != nil {
		return v, err
	}
	kept := slices.DeleteFunc(slices.Clone(v.Published), func(o intent.Publication) bool { return o.Proto == proto && o.Port == port })
	if len(kept) == len(v.Published) {
		return v, notFound("port", "publication %s %d of vm %s", proto, port, v.FullName())
	}
	if len(kept) == 0 {
		kept = nil
	}
	v.Published = kept
	if err := store.PutJSON(ctx, c.store, intent.VMsPrefix+v.FullName(), v); err != nil {
		return v, err
	}
	c.log.Info("port unpublished", "vm", v.FullName(), "proto", proto, "port", port, "host", v.Host)
	return v, nil
}

// checkPublished refuses v's published ports on v.Host when another
// holder of the host's address in ls has one: a sliver's lease, a VM's
// slice (v's own too), another VM's publication, the host's ephemeral
// range; or when two of v's own share a public port.
func (c *Controller) checkPublished(ctx context.Context, ls *leaseSpace, v intent.VM) error {
	if len(v.Published) == 0 {
		return nil
	}
	node, err := c.node(ctx, v.Host)
	if err != nil {
		return err
	}
	lo, hi := lease.Ephemeral(node)
	holders := slices.Concat(ls.slivers, ls.holders(v.FullName()))
	if l, ok := ls.claims[v.FullName()]; ok {
		holders = append(holders, intent.Sliver{Host: v.Host, Name: "egress slice of " + v.FullName(), Leases: []intent.Lease{l}})
	}
	for i, p := range v.Published {
		others := slices.Concat(holders, publicationHolders(v.Host, v.FullName(), v.Published[:i]))
		if err := lease.Overlap(v.Host, "", []intent.Lease{p.Lease()}, others, lo, hi); err != nil {
			return &FieldError{Field: "publicPort", Msg: fmt.Sprintf("publication %s of vm %s: %v", p, v.FullName(), err), kind: ErrConflict}
		}
	}
	return nil
}

// publicationHolder names a publication as a holder of its host's port,
// beside slivers and slices (hostSlices): "publication tcp 80 on 8080 of
// blue/web/web1".
func publicationHolder(vm string, p intent.Publication) string {
	return "publication " + p.String() + " of " + vm
}

// withPublished is v, moved to another host or subnet, with the
// publications of was (its record before the move) leased there: the same
// public ports, each refused (409, naming the holder) when v's host has it
// taken, so a move never changes a public port behind its clients' backs.
// A check before anything is written; putVM decides again in the
// transaction that writes the VM.
func (c *Controller) withPublished(ctx context.Context, v, was intent.VM) (intent.VM, error) {
	v.Published = slices.Clone(was.Published)
	if len(v.Published) == 0 {
		return v, nil
	}
	ls, _, err := c.readLeases(ctx, v.Host)
	if err != nil {
		return v, err
	}
	// Its own leases under its old name are what it takes along.
	ls.setPublished(was.FullName(), nil)
	delete(ls.claims, was.FullName())
	return v, c.checkPublished(ctx, ls, v)
}

func sortPublished(ps []intent.Publication) {
	slices.SortFunc(ps, func(a, b intent.Publication) int {
		if a.PublicPort != b.PublicPort {
			return int(a.PublicPort) - int(b.PublicPort)
		}
		return strings.Compare(a.Proto, b.Proto)
	})
}
