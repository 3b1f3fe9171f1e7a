package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// Floating addresses (docs/north-south.md): the operator's pool of fabric
// addresses, each attached to at most one VM, which is reached on it whole
// and leaves by it, on whatever host it lives (the VM's record carries it,
// so a move moves it and a delete frees it).
//
// Every route is the operator's (scopeAdmin), attach and detach included:
// the pool is the cloud's, not a farm's, so a tenant allowed to attach
// would take an address the operator meant for another tenant (and the
// DNS names pointing at it); and a fabric address faces the outside world,
// whose trust an operator decides.

// FloatingBody is what POST /v1/floating reads.
type FloatingBody struct {
	Address string `json:"address"`
}

// FloatingAttachBody is what PUT /v1/floating/{address}/vm reads.
type FloatingAttachBody struct {
	VM string `json:"vm"` // FARM/SUBNET/VM
}

func (c *Controller) floatingRoutes(mux *router) {
	mux.HandleFunc("GET /v1/floating", func(w http.ResponseWriter, r *http.Request) {
		out, err := c.ListFloating(r.Context())
		reply(w, http.StatusOK, out, err)
	})
	mux.HandleFunc("POST /v1/floating", func(w http.ResponseWriter, r *http.Request) {
		var in FloatingBody
		if decode(w, r, &in) {
			f, err := c.CreateFloating(r.Context(), in.Address)
			reply(w, http.StatusCreated, f, err)
		}
	})
	mux.HandleFunc("DELETE /v1/floating/{address}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusNoContent, nil, c.DeleteFloating(r.Context(), r.PathValue("address")))
	})
	mux.HandleFunc("PUT /v1/floating/{address}/vm", func(w http.ResponseWriter, r *http.Request) {
		var in FloatingAttachBody
		if decode(w, r, &in) {
			f, err := c.AttachFloating(r.Context(), r.PathValue("address"), in.VM)
			reply(w, http.StatusOK, f, err)
		}
	})
	mux.HandleFunc("DELETE /v1/floating/{address}/vm", func(w http.ResponseWriter, r *http.Request) {
		f, err := c.DetachFloating(r.Context(), r.PathValue("address"))
		reply(w, http.StatusOK, f, err)
	})
}

// floatingAddr reads s (field names where it came from): an IPv4 address
// outside the tenant space.
func floatingAddr(field, s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return a, fieldErr(field, fmt.Errorf("%q: want an IPv4 address on the fabric, such as 192.168.0.50", s))
	}
	if p := addrplan.Current(); p.Contains(a) {
		return a, fieldErr(field, fmt.Errorf("%s is in the tenant space %s: a floating address is a fabric address", a, p.Prefix))
	}
	return a, nil
}

// CreateFloating adds address to the pool: an IPv4 address outside the
// tenant space, on the fabric subnet of a host's uplink (where ARP for it
// can reach the host its VM is on), and no host's own address.
func (c *Controller) CreateFloating(ctx context.Context, address string) (intent.FloatingAddress, error) {
	a, err := floatingAddr("address", address)
	if err != nil {
		return intent.FloatingAddress{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	nodes, _, err := store.ListJSON[intent.Node](ctx, c.store, intent.NodesPrefix)
	if err != nil {
		return intent.FloatingAddress{}, err
	}
	slices.SortFunc(nodes, func(a, b intent.Node) int { return strings.Compare(a.Name, b.Name) })
	hosts, _, err := store.ListJSON[intent.Host](ctx, c.store, intent.HostsPrefix)
	if err != nil {
		return intent.FloatingAddress{}, err
	}
	for _, h := range hosts {
		if h.Address == a.String() {
			return intent.FloatingAddress{}, held("address", "%s is host %s's own address", a, h.Name)
		}
	}
	var fabrics []string
	onFabric := false
	for _, n := range nodes {
		for _, u := range nodeFabrics(n) {
			if u.Addr() == a {
				return intent.FloatingAddress{}, held("address", "%s is host %s's own address", a, n.Name)
			}
			if u.Contains(a) {
				onFabric = true
			}
			fabrics = append(fabrics, n.Name+" "+u.Masked().String())
		}
	}
	if !onFabric {
		if len(fabrics) == 0 {
			return intent.FloatingAddress{}, fieldErr("address", fmt.Errorf("%s: no host has reported its fabric subnet yet, so none can hold it", a))
		}
		return intent.FloatingAddress{}, fieldErr("address", fmt.Errorf("%s is on no host's fabric subnet (%s)", a, strings.Join(fabrics, ", ")))
	}
	key := intent.FloatingPrefix + a.String()
	if _, err := c.store.Get(ctx, key); err == nil {
		return intent.FloatingAddress{}, conflict("address", "floating address %s is in the pool", a)
	} else if !errors.Is(err, store.ErrNotFound) {
		return intent.FloatingAddress{}, err
	}
	f := intent.FloatingAddress{Address: a.String()}
	return f, store.PutJSON(ctx, c.store, key, f)
}

// held refuses what field names with 409: it is someone's (the message
// names whose) or not in the state asked for.
func held(field, format string, a ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, a...), kind: ErrConflict}
}

// nodeFabrics are n's uplinks' addresses with their fabric prefix lengths.
func nodeFabrics(n intent.Node) []netip.Prefix {
	var out []netip.Prefix
	for _, u := range n.Uplinks {
		if a, err := netip.ParseAddr(u.IP); err == nil && u.Bits > 0 {
			out = append(out, netip.PrefixFrom(a, u.Bits))
		}
	}
	return out
}

// floating reads address's pool record and who holds it now: its VM, if
// that VM's record still says so (404 naming the address when it is not in
// the pool).
func (c *Controller) floating(ctx context.Context, field, address string) (intent.FloatingAddress, *intent.VM, error) {
	a, err := floatingAddr(field, address)
	if err != nil {
		return intent.FloatingAddress{}, nil, err
	}
	var f intent.FloatingAddress
	err = store.GetJSON(ctx, c.store, intent.FloatingPrefix+a.String(), &f)
	if errors.Is(err, store.ErrNotFound) {
		return f, nil, notFound(field, "floating address %s is not in the pool (onehop floating create %s)", a, a)
	}
	if err != nil || f.VM == "" {
		return f, nil, err
	}
	p := strings.Split(f.VM, "/")
	var v intent.VM
	if len(p) != 3 {
		return f, nil, nil
	}
	err = store.GetJSON(ctx, c.store, intent.VMKey(p[0], p[1], p[2]), &v)
	if errors.Is(err, store.ErrNotFound) || (err == nil && v.Floating != f.Address) {
		return f, nil, nil // deleted, or detached half way: free
	}
	if err != nil {
		return f, nil, err
	}
	f.Host = v.Host
	return f, &v, nil
}

// DeleteFloating takes address out of the pool: 409 naming its VM while
// one holds it.
func (c *Controller) DeleteFloating(ctx context.Context, address string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, holder, err := c.floating(ctx, "address", address)
	if err != nil {
		return err
	}
	if holder != nil {
		return held("address", "floating address %s is attached to vm %s: detach it first (onehop floating detach %s)", f.Address, f.VM, f.Address)
	}
	return c.store.Delete(ctx, intent.FloatingPrefix+f.Address)
}

// AttachFloating gives address to vm (FARM/SUBNET/VM). 409 naming the
// holder when another VM has it, or naming the VM's own when it has
// another; attaching it again to its holder changes nothing. The pool
// record names the VM before the VM's record takes the address, so a
// failure between leaves the address free, never held twice.
func (c *Controller) AttachFloating(ctx context.Context, address, vm string) (intent.FloatingAddress, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, holder, err := c.floating(ctx, "address", address)
	if err != nil {
		return f, err
	}
	p := strings.Split(vm, "/")
	if len(p) != 3 || slices.Contains(p, "") {
		return f, fieldErr("vm", fmt.Errorf("%q: want FARM/SUBNET/VM", vm))
	}
	v, err := c.getVM(ctx, p[0], p[1], p[2])
	if err != nil {
		return f, err
	}
	if holder != nil {
		if holder.FullName() == v.FullName() {
			return f, nil
		}
		return f, held("address", "floating address %s is attached to vm %s: detach it first (onehop floating detach %s)", f.Address, f.VM, f.Address)
	}
	if v.Floating != "" {
		return f, held("vm", "vm %s has floating address %s already: detach it first", v.FullName(), v.Floating)
	}
	if err := c.onHostFabric(ctx, v, f.Address); err != nil {
		return f, err
	}
	f.VM, f.Host = v.FullName(), ""
	if err := store.PutJSON(ctx, c.store, intent.FloatingPrefix+f.Address, f); err != nil {
		return f, err
	}
	v.Floating = f.Address
	if err := store.PutJSON(ctx, c.store, intent.VMsPrefix+v.FullName(), v); err != nil {
		return f, err
	}
	f.Host = v.Host
	return f, nil
}

// onHostFabric refuses address for v when v's host has reported a fabric
// subnet that does not hold it: nobody on the fabric would ARP there.
func (c *Controller) onHostFabric(ctx context.Context, v intent.VM, address string) error {
	n, err := c.node(ctx, v.Host)
	if err != nil {
		return err
	}
	a := netip.MustParseAddr(address)
	fabrics := nodeFabrics(n)
	for _, u := range fabrics {
		if u.Contains(a) {
			return nil
		}
	}
	if len(fabrics) == 0 {
		return nil // not reported yet: its agent refuses nothing, the address waits
	}
	return fieldErr("vm", fmt.Errorf("vm %s's host %s is on fabric %s, which does not hold %s", v.FullName(), v.Host, fabrics[0].Masked(), a))
}

// DetachFloating takes address from its VM: 409 when no VM holds it.
func (c *Controller) DetachFloating(ctx context.Context, address string) (intent.FloatingAddress, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, holder, err := c.floating(ctx, "address", address)
	if err != nil {
		return f, err
	}
	if holder == nil {
		return intent.FloatingAddress{Address: f.Address}, held("address", "floating address %s is not attached to any vm", f.Address)
	}
	holder.Floating = ""
	if err := store.PutJSON(ctx, c.store, intent.VMsPrefix+holder.FullName(), *holder); err != nil {
		return f, err
	}
	f.VM, f.Host = "", ""
	return f, store.PutJSON(ctx, c.store, intent.FloatingPrefix+f.Address, f)
}

// ListFloating is the pool, by address, each with the VM that holds it
// now and that VM's host.
func (c *Controller) ListFloating(ctx context.Context) ([]intent.FloatingAddress, error) {
	pool, _, err := store.ListJSON[intent.FloatingAddress](ctx, c.store, intent.FloatingPrefix)
	if err != nil {
		return nil, err
	}
	out := make([]intent.FloatingAddress, 0, len(pool))
	for _, p := range pool {
		f, holder, err := c.floating(ctx, "address", p.Address)
		if err != nil {
			return nil, err
		}
		if holder == nil {
			f.VM, f.Host = "", ""
		}
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b intent.FloatingAddress) int {
		return netip.MustParseAddr(a.Address).Compare(netip.MustParseAddr(b.Address))
	})
	return out, nil
}

// renameFloatingHolder points v's floating address's pool record at v's
// name after a move to another subnet renamed it (c.mu held).
func (c *Controller) renameFloatingHolder(ctx context.Context, v intent.VM) error {
	if v.Floating == "" {
		return nil
	}
	key := intent.FloatingPrefix + v.Floating
	var f intent.FloatingAddress
	if err := store.GetJSON(ctx, c.store, key, &f); err != nil {
		return fmt.Errorf("floating address %s of vm %s: %w", v.Floating, v.FullName(), err)
	}
	f.VM, f.Host = v.FullName(), ""
	return store.PutJSON(ctx, c.store, key, f)
}
