package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// vmRoutes serves VMs: create (allocating 10.f.s.h), get, list a farm's,
// delete, move.
func (c *Controller) vmRoutes(mux *router) {
	mux.HandleFunc("GET /v1/vms", c.farmList(intent.VMsPrefix, func() any { return &[]intent.VM{} }))
	mux.HandleFunc("POST /v1/farms/{farm}/subnets/{subnet}/vms", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Name string `json:"name"`
			Host string `json:"host"`
			// Interface is the host interface that carries the guest
			// (a veth's host end, a tap); "": intent.VifName(farm, name).
			Interface string `json:"interface"`
			// Container: the CNI attachment the VM is made for (the
			// plugin's ADD), which its GC compares.
			Container *intent.VMContainer `json:"container"`
		}
		if decode(w, r, &in) {
			v, err := c.CreateVMFor(r.Context(), r.PathValue("farm"), r.PathValue("subnet"), in.Name, in.Host, in.Interface, in.Container)
			reply(w, http.StatusCreated, v, err)
		}
	})
	mux.HandleFunc("GET /v1/farms/{farm}/vms", func(w http.ResponseWriter, r *http.Request) {
		out, err := c.farmVMs(r)
		reply(w, http.StatusOK, out, err)
	})
	// One VM: what the CNI plugin reads, rather than every VM of the cloud.
	mux.HandleFunc("GET /v1/farms/{farm}/subnets/{subnet}/vms/{vm}", func(w http.ResponseWriter, r *http.Request) {
		var v intent.VM
		err := checkPath(r, "farm", "subnet", "vm")
		if err == nil {
			v, err = c.getVM(r.Context(), r.PathValue("farm"), r.PathValue("subnet"), r.PathValue("vm"))
		}
		reply(w, http.StatusOK, v, err)
	})
	mux.HandleFunc("DELETE /v1/farms/{farm}/subnets/{subnet}/vms/{vm}", func(w http.ResponseWriter, r *http.Request) {
		err := checkPath(r, "farm", "subnet", "vm")
		if err == nil {
			err = c.DeleteVM(r.Context(), r.PathValue("farm"), r.PathValue("subnet"), r.PathValue("vm"))
		}
		reply(w, http.StatusNoContent, nil, err)
	})
	mux.HandleFunc("PUT /v1/farms/{farm}/subnets/{subnet}/vms/{vm}/host", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Host string `json:"host"`
			// Subnet, FARM/SUBNET, moves the VM to another subnet of its
			// farm as well: it gets a new address there (api_vms_move.go).
			Subnet string `json:"subnet"`
		}
		if decode(w, r, &in) {
			v, err := c.MoveVM(r.Context(), r.PathValue("farm"), r.PathValue("subnet"), r.PathValue("vm"), in.Host, in.Subnet)
			reply(w, http.StatusOK, v, err)
		}
	})
}

// CreateVM places farm/subnet/name on host, on its default interface
// (intent.VifName), and allocates its address. The name is unique within
// the farm: another farm may have a VM of the same name.
func (c *Controller) CreateVM(ctx context.Context, farm, subnet, name, host string) (intent.VM, error) {
	return c.CreateVMWithInterface(ctx, farm, subnet, name, host, "")
}

// CreateVMWithInterface is CreateVM with the host interface that carries
// the guest named (a tap QEMU opens, a veth a runtime makes); "" is the
// default, intent.VifName(farm, name). No two VMs on one host share one.
func (c *Controller) CreateVMWithInterface(ctx context.Context, farm, subnet, name, host, iface string) (intent.VM, error) {
	return c.CreateVMFor(ctx, farm, subnet, name, host, iface, nil)
}

// CreateVMFor is CreateVMWithInterface for a CNI attachment (nil: none),
// which the VM's record keeps.
func (c *Controller) CreateVMFor(ctx context.Context, farm, subnet, name, host, iface string, container *intent.VMContainer) (intent.VM, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := topology.CheckVMName(name); err != nil {
		return intent.VM{}, fieldErr("name", err)
	}
	if container != nil {
		if err := container.Check("container"); err != nil {
			return intent.VM{}, fieldErr("container", err)
		}
	}
	if iface == "" {
		iface = intent.VifName(farm, name)
	}
	if err := intent.CheckInterface("interface", iface); err != nil {
		return intent.VM{}, fieldErr("interface", err)
	}
	if _, err := c.store.Get(ctx, intent.SubnetKey(farm, subnet)); errors.Is(err, store.ErrNotFound) {
		return intent.VM{}, notFound("subnet", "subnet %s/%s", farm, subnet)
	}
	if _, err := c.store.Get(ctx, intent.HostsPrefix+host); errors.Is(err, store.ErrNotFound) {
		return intent.VM{}, fieldErr("host", fmt.Errorf("no host %q", host))
	}
	// VMs and hosts share one set of node names, as the lab's namespaces
	// oh-LAB-NAME do (a name several farms' VMs share is no node of its
	// own there: docs/lab.md).
	if _, err := c.store.Get(ctx, intent.HostsPrefix+name); err == nil {
		return intent.VM{}, conflict("name", "host %q (VMs and hosts share one set of node names, as the lab's namespaces oh-LAB-NAME do)", name)
	}
	// Unique within the farm: red may have a web1 as blue does.
	if err := c.view(ctx, func(m *model) error {
		if full := m.namedIn(farm, name); full != "" {
			return conflict("name", "vm %s (a VM's name is unique within its farm)", full)
		}
		return nil
	}); err != nil {
		return intent.VM{}, err
	}
	if err := c.checkRoom(ctx, host); err != nil {
		return intent.VM{}, err
	}
	if err := c.checkInterfaceFree(ctx, host, iface, ""); err != nil {
		return intent.VM{}, err
	}
	a, err := c.allocIn(ctx, farm+"/"+subnet)
	if err != nil {
		return intent.VM{}, err
	}
	held, err := c.heldAddrs(ctx)
	if err != nil {
		return intent.VM{}, err
	}
	ip, err := a.VMExcept(farm, subnet, name, held)
	if err != nil {
		return intent.VM{}, allocErr("subnet", err)
	}
	v := intent.NewVM(farm, subnet, name, host, ip)
	v.Interface, v.Container = iface, container
	eg, err := c.egressOf(ctx, farm, subnet)
	if err != nil {
		return v, err
	}
	if err := c.checkEgressRoom(ctx, v, eg); err != nil {
		return v, err
	}
	if err := c.saveAlloc(ctx, a, farm+"/"+subnet); err != nil {
		return v, err
	}
	return c.putVM(ctx, intent.VMsPrefix+v.FullName(), v, eg)
}

// checkRoom refuses one more VM on a host whose datapath is full
// (limits.MaxVMsPerHost endpoints): refused here, with an error naming the
// host, it never reaches the host's agent, where it could not be programmed
// and would take the host's other VMs down with it.
func (c *Controller) checkRoom(ctx context.Context, host string) error {
	var n int
	if err := c.view(ctx, func(m *model) error { n = len(m.onHost[host]); return nil }); err != nil {
		return err
	}
	if n >= c.maxVMsPerHost {
		return full("host", fmt.Errorf("host %q holds %d VMs, as many as its datapath holds (%d), 0 left: place the VM on another host", host, n, c.maxVMsPerHost))
	}
	return nil
}

// checkInterfaceFree refuses iface on host when another VM than except
// (FARM/SUBNET/VM) is on it there: the agent could attach the interface to
// only one of them.
func (c *Controller) checkInterfaceFree(ctx context.Context, host, iface, except string) error {
	return c.view(ctx, func(m *model) error {
		on := m.onIface[ifaceKey{host, iface}]
		if len(on) == 0 || len(on) == 1 && on[except] {
			return nil
		}
		for _, full := range sortedKeys(on) {
			if full != except {
				return conflict("interface", "interface %s of host %s, vm %s's,", iface, host, full)
			}
		}
		return nil
	})
}

// farmVMs lists the VMs of r's farm, by FARM/SUBNET/VM.
func (c *Controller) farmVMs(r *http.Request) ([]intent.VM, error) {
	if err := checkPath(r, "farm"); err != nil {
		return nil, err
	}
	farm := r.PathValue("farm")
	if _, err := c.getFarm(r.Context(), farm); err != nil {
		return nil, err
	}
	out, _, err := store.ListJSON[intent.VM](r.Context(), c.store, intent.VMsPrefix+farm+"/")
	slices.SortFunc(out, func(a, b intent.VM) int { return strings.Compare(a.FullName(), b.FullName()) })
	return out, err
}

// getVM reads farm/subnet/name: 404 naming the farm, the subnet or the vm,
// whichever is not there.
func (c *Controller) getVM(ctx context.Context, farm, subnet, name string) (intent.VM, error) {
	var v intent.VM
	if _, err := c.getSubnet(ctx, farm, subnet); err != nil {
		return v, err
	}
	err := store.GetJSON(ctx, c.store, intent.VMKey(farm, subnet, name), &v)
	if errors.Is(err, store.ErrNotFound) {
		return v, notFound("vm", "vm %s/%s/%s", farm, subnet, name)
	}
	return v, err
}

// DeleteVM removes a VM: its record, its desired key on its host (the
// model deletes it) and its id, so a new VM of the subnet gets its
// address.
func (c *Controller) DeleteVM(ctx context.Context, farm, subnet, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deleteVMLocked(ctx, farm, subnet, name)
}

// deleteVMLocked is DeleteVM with c.mu held. The record goes before the
// id: a failure between leaves an id unused, never an address two VMs
// hold.
func (c *Controller) deleteVMLocked(ctx context.Context, farm, subnet, name string) error {
	key := intent.VMKey(farm, subnet, name)
	if _, err := c.store.Get(ctx, key); errors.Is(err, store.ErrNotFound) {
		return notFound("vm", "vm %s/%s/%s", farm, subnet, name)
	} else if err != nil {
		return err
	}
	if err := c.store.Delete(ctx, key); err != nil {
		return err
	}
	a, err := c.allocIn(ctx, farm+"/"+subnet)
	if err != nil {
		return err
	}
	delete(a.VMs, farm+"/"+subnet+"/"+name)
	return c.saveAlloc(ctx, a, farm+"/"+subnet)
}
