package lab

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/topology"
)

// moveTimeout bounds how long a move waits for the new host's datapath.
const moveTimeout = 30 * time.Second

// Move moves a VM (NAME, FARM/VM or FARM/SUBNET/VM: State.Node) to another
// host of the lab, as a live migration would. The
// VM's vif is taken down and re-plumbed into the new host's namespace, the
// controller is told, and the vif comes up again only once the new host's
// agent reports its datapath on it: a vif up before that would hand what
// the VM sends to the new host's own IP stack. The VM keeps its interface,
// address and MAC, so its established connections carry on once the hosts'
// tables follow.
//
// With toSubnet (FARM/SUBNET) the VM moves to that subnet of its farm as
// well (toHost may then be its own host): the controller gives it a new
// address there, and before its vif comes up again the VM's eth0 takes the
// new address, virtual MAC and default route (readdressVM). Nothing in the
// VM's namespace restarts: its processes and sockets stay.
func Move(st *State, vmName, toHost, toSubnet string) (*intent.VM, error) {
	if st.APISocket == "" || st.Datapath == topology.DatapathBridge {
		return nil, fmt.Errorf("lab %q has no controller to move VMs with", st.Name)
	}
	if st.Kinds[toHost] != "host" {
		return nil, fmt.Errorf("lab %q has no host %q", st.Name, toHost)
	}
	idx, err := st.vm(vmName)
	if err != nil {
		return nil, err
	}
	vm := st.VMs[idx]
	node := st.VMNode(vm)
	if toSubnet != "" {
		if err := checkSubnetMove(vm, toSubnet); err != nil {
			return nil, err
		}
		// Asked before the vif is touched, so the answer to a typo is not
		// a vif moved away and back.
		if err := subnetExists(st, toSubnet); err != nil {
			return nil, err
		}
	}
	ctx := context.Background()
	vif := vm.Interface
	if vif == "" { // a state file from before VMs named their interface: vif-NAME
		vif = intent.VifPrefix + vm.Name
	}
	if vm.Host == toHost && toSubnet == "" {
		// A move stopped before its vif came up is finished by asking again.
		if up, err := linkUp(NamespaceOf(st.Name, toHost), vif); err != nil || up {
			return nil, fmt.Errorf("vm %s is already on %s", vmName, toHost)
		}
		if err := activateVif(ctx, st, toHost, vif, vm.IP); err != nil {
			return nil, fmt.Errorf("vm %s on %s: %w", vmName, toHost, err)
		}
		v := vm
		return &v, nil
	}
	from, to := NamespaceOf(st.Name, vm.Host), NamespaceOf(st.Name, toHost)
	// The vif moves first: the new host's agent then finds it as soon as
	// the controller places the VM there, rather than at its next resync.
	// A VM that changes subnet on its own host has its vif taken down
	// instead, so nothing it sends meets the datapath while its addresses
	// and the host's entries for it disagree.
	if from == to {
		if err := setLinkUp(from, vif, false); err != nil {
			return nil, fmt.Errorf("take the vif of %s down: %w", vmName, err)
		}
	} else if err := moveLink(from, to, vif); err != nil {
		return nil, fmt.Errorf("move vif of %s to %s: %w", vmName, toHost, err)
	}
	var moved intent.VM
	path := fmt.Sprintf("/v1/farms/%s/subnets/%s/vms/%s/host", vm.Farm, vm.Subnet, vm.Name)
	body := map[string]string{"host": toHost}
	if toSubnet != "" {
		body["subnet"] = toSubnet
	}
	if err := client.New(st.APISocket).Do("PUT", path, body, &moved); err != nil {
		err = fmt.Errorf("move %s in the controller: %w", vmName, err)
		// Put it back where the controller still has it.
		if from != to {
			if berr := moveLink(to, from, vif); berr != nil {
				return nil, errors.Join(err, fmt.Errorf("and putting its vif back on %s: %w", vm.Host, berr))
			}
		}
		if berr := activateVif(ctx, st, vm.Host, vif, vm.IP); berr != nil {
			return nil, errors.Join(err, berr)
		}
		return nil, err
	}
	// Recorded as soon as the controller has it, so the lab and the
	// controller agree on where the VM is whatever fails next.
	st.VMs[idx] = moved
	if err := st.save(); err != nil {
		return nil, err
	}
	if toSubnet != "" {
		// The vif is down: the VM is re-addressed before any frame of
		// its can reach the new host's datapath.
		if err := readdressVM(NamespaceOf(st.Name, node), vm, moved); err != nil {
			return nil, fmt.Errorf("vm %s is %s on %s in the controller, its vif left down: %w", vmName, moved.IP, toHost, err)
		}
	}
	if err := activateVif(ctx, st, toHost, vif, moved.IP); err != nil {
		return nil, fmt.Errorf("vm %s on %s: %w", vmName, toHost, err)
	}
	return &moved, nil
}

// activateVif brings vif on host up once host's datapath is on it, serving
// the VM at ip.
func activateVif(ctx context.Context, st *State, host, vif, ip string) error {
	if err := waitVifAttached(ctx, st, host, vif, ip, moveTimeout); err != nil {
		return fmt.Errorf("vif %s left down: %w", vif, err)
	}
	return setLinkUp(NamespaceOf(st.Name, host), vif, true)
}
