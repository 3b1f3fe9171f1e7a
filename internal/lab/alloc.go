package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/desired"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ipam"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// Allocation: what the controller gave each VM, and the store it is read from.

// allocation returns the address, MAC and interface of the VM that is lab
// node node (topology.File.VMNode), reading every VM's allocation the first
// time one is asked for.
func (b *builder) allocation(ctx context.Context, node string) (intent.VM, error) {
	if b.vms == nil {
		vms, err := b.allocations(ctx)
		if err != nil {
			return intent.VM{}, err
		}
		b.vms = vms
		for _, v := range b.t.VMs {
			b.st.VMs = append(b.st.VMs, vms[b.t.VMNode(v)])
		}
		if err := b.st.save(); err != nil {
			return intent.VM{}, err
		}
	}
	v, ok := b.vms[node]
	if !ok {
		return intent.VM{}, fmt.Errorf("no allocation for vm %s", node)
	}
	return v, nil
}

// allocations returns each VM's record by node: read back from the controller in
// onehop mode (it is the only allocator), computed locally in bridge mode
// (no controller runs there; the same allocator gives the same addresses).
func (b *builder) allocations(ctx context.Context) (map[string]intent.VM, error) {
	out := map[string]intent.VM{}
	if b.t.Datapath == topology.DatapathBridge {
		// No controller, no store: the file's plan is the cloud's.
		if err := addrplan.Set(b.t.AddrPlan()); err != nil {
			return nil, err
		}
		var a ipam.Allocations
		for _, vm := range b.t.VMs {
			ip, err := a.VM(vm.Farm(), vm.SubnetName(), vm.Name)
			if err != nil {
				return nil, err
			}
			v := intent.NewVM(vm.Farm(), vm.SubnetName(), vm.Name, vm.Host, ip)
			v.Interface = vm.Vif()
			out[b.t.VMNode(vm)] = v
		}
		return out, nil
	}
	b.step("waiting for the controller to allocate %d VM addresses", len(b.t.VMs))
	err := b.poll(ctx, "the controller to allocate addresses", func() (bool, string, error) {
		vms, err := b.readVMs(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		if len(vms) != len(b.t.VMs) {
			return false, fmt.Sprintf("%d of %d allocated", len(vms), len(b.t.VMs)), nil
		}
		for _, v := range vms {
			if vm, ok := b.t.VMOf(v.Farm, v.Subnet, v.Name); ok {
				out[b.t.VMNode(vm)] = v
			}
		}
		return true, "", nil
	})
	return out, err
}

func (b *builder) readVMs(ctx context.Context) ([]intent.VM, error) {
	s, err := b.store()
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	vms, _, err := store.ListJSON[intent.VM](cctx, s, intent.VMsPrefix)
	return vms, err
}

// waitStore waits until the controller's store answers, and takes the
// cloud's address plan from it: the controller records it at start, before
// it writes any intent, so until it is there the controller has not
// settled it.
func (b *builder) waitStore(ctx context.Context) error {
	return b.poll(ctx, "the controller's store", func() (bool, string, error) {
		_, err := b.readVMs(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		s, err := b.store()
		if err != nil {
			return false, err.Error(), nil
		}
		p, found, err := desired.Plan(ctx, s)
		switch {
		case err != nil:
			return false, err.Error(), nil
		case !found:
			return false, "the controller has not recorded the address plan yet", nil
		}
		return true, "", addrplan.Set(p)
	})
}

// store returns a connection to the lab's etcd, made the first time the
// controller answers and kept until Up ends.
func (b *builder) store() (store.Store, error) {
	if b.conn == nil {
		c, err := dialStore(b.st)
		if err != nil {
			return nil, err
		}
		b.conn = c
	}
	return b.conn, nil
}

// dialStore connects to the lab's etcd over its unix socket.
func dialStore(st *State) (*store.Etcd, error) {
	if _, err := os.Stat(st.EtcdSocket); err != nil {
		return nil, errors.New("etcd socket not there yet")
	}
	return store.DialEtcd([]string{"unix://" + st.EtcdSocket})
}
