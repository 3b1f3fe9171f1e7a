package lab

import (
	"fmt"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/topology"
)

// Move moves a VM to another host of the lab, as a live migration would: the
// controller is told first, then the VM's vif is re-plumbed into the new
// host's namespace. The VM keeps its interface, address and MAC, so its
// established connections carry on once the hosts' tables follow.
func Move(st *State, vmName, toHost string) (*intent.VM, error) {
	if st.APISocket == "" || st.Datapath == topology.DatapathBridge {
		return nil, fmt.Errorf("lab %q has no controller to move VMs with", st.Name)
	}
	if st.Kinds[toHost] != "host" {
		return nil, fmt.Errorf("lab %q has no host %q", st.Name, toHost)
	}
	idx := -1
	for i, v := range st.VMs {
		if v.Name == vmName {
			idx = i
		}
	}
	if idx < 0 {
		return nil, fmt.Errorf("lab %q has no VM %q", st.Name, vmName)
	}
	vm := st.VMs[idx]
	if vm.Host == toHost {
		return nil, fmt.Errorf("vm %s is already on %s", vmName, toHost)
	}
	var moved intent.VM
	path := fmt.Sprintf("/v1/farms/%s/subnets/%s/vms/%s/host", vm.Farm, vm.Subnet, vm.Name)
	if err := client.New(st.APISocket).Do("PUT", path, map[string]string{"host": toHost}, &moved); err != nil {
		return nil, fmt.Errorf("move %s in the controller: %w", vmName, err)
	}
	from, err := netns.Handle(NamespaceOf(st.Name, vm.Host))
	if err != nil {
		return nil, err
	}
	defer from.Close()
	vif, err := from.LinkByName(topology.VifName(vmName))
	if err != nil {
		return nil, fmt.Errorf("vif of %s on %s: %w", vmName, vm.Host, err)
	}
	toFd, err := netns.Fd(NamespaceOf(st.Name, toHost))
	if err != nil {
		return nil, err
	}
	defer toFd.Close()
	if err := from.LinkSetNsFd(vif, int(toFd)); err != nil {
		return nil, fmt.Errorf("move vif of %s to %s: %w", vmName, toHost, err)
	}
	to, err := netns.Handle(NamespaceOf(st.Name, toHost))
	if err != nil {
		return nil, err
	}
	defer to.Close()
	vif, err = to.LinkByName(topology.VifName(vmName))
	if err == nil {
		err = to.LinkSetUp(vif)
	}
	if err != nil {
		return nil, fmt.Errorf("bring up vif of %s on %s: %w", vmName, toHost, err)
	}
	st.VMs[idx].Host = toHost
	return &moved, st.save()
}
