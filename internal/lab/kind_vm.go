package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/topology"
)

// vmKind is a tenant guest: a namespace whose eth0 is one end of a veth
// pair; the other end, the vif, lives in its host's namespace. The vif is
// made down and comes up only once the host's datapath is on it, so not one
// frame of the VM reaches the host's own IP stack (it would answer ARP for
// its fabric address, and echo requests).
type vmKind struct{}

func (vmKind) kind() string { return "vm" }

func (vmKind) nodes(t *topology.File) []string {
	out := make([]string, 0, len(t.VMs))
	for _, v := range t.VMs {
		out = append(out, t.VMNode(v))
	}
	return out
}

func (vmKind) plumb(ctx context.Context, b *builder, node string) error {
	v, err := b.allocation(ctx, node)
	if err != nil {
		return err
	}
	vm, _ := b.t.VMByNode(node)
	how := "static"
	if vm.DHCP {
		how = "by DHCP"
	}
	b.step("vm %s on %s: %s %s gw %s, %s (%s)", v.FullName(), vm.Host, v.IP, v.MAC, v.Gateway, v.Interface, how)
	vmNS, err := b.newNamespace(node, "vm")
	if err != nil {
		return err
	}
	hostNS := NamespaceOf(b.t.Name, vm.Host)
	if err := plugVM(hostNS, vmNS, v.FullName(), v.Interface, v.MAC, b.t.Datapath == topology.DatapathBridge); err != nil {
		return err
	}
	if vm.DHCP {
		return nil // the VM asks for its address itself
	}
	return addressVM(vmNS, v.FullName(), v)
}

// start starts the VM's own daemons: the VNAT daemon, with vnat: true.
func (vmKind) start(ctx context.Context, b *builder, node string) error {
	if !vnatOf(b.t, node) {
		return nil
	}
	return startVNAT(ctx, b, node, VMInterface)
}

// activate brings the vif up: every host is ready, so its datapath is on it
// (which the kernel confirms, in an onehop lab).
func (vmKind) activate(ctx context.Context, b *builder, node string) error {
	vm, err := b.allocation(ctx, node)
	if err != nil {
		return err
	}
	hostNS, vif := NamespaceOf(b.t.Name, vm.Host), vm.Interface
	if b.t.Datapath == topology.DatapathOnehop {
		on, err := tcxAttached(hostNS, vif)
		if err != nil {
			return err
		}
		if !on {
			return fmt.Errorf("vm %s: %s's agent reports %s attached, yet no program is on it; left down", vm.FullName(), vm.Host, vif)
		}
	}
	return setLinkUp(hostNS, vif, true)
}

func (vmKind) report(n *NodeReport, f *statusFacts) { n.VM = f.vms[n.Name] }

// plugVM makes the VM's veth pair: eth0 (up, with the VM's MAC) in vmNS and
// the vif, named vifName (the interface the controller's record names), down,
// in hostNS (on the host's bridge in a bridge lab).
func plugVM(hostNS, vmNS, vm, vifName, macStr string, onBridge bool) error {
	mac, err := net.ParseMAC(macStr)
	if err != nil {
		return fmt.Errorf("vm %s: MAC %q: %w", vm, macStr, err)
	}
	vmFd, err := netns.Fd(vmNS)
	if err != nil {
		return err
	}
	defer vmFd.Close()
	hh, err := netns.Handle(hostNS)
	if err != nil {
		return err
	}
	defer hh.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: vifName}, PeerName: VMInterface,
		PeerHardwareAddr: mac, PeerNamespace: netlink.NsFd(int(vmFd))}
	if err := hh.LinkAdd(veth); err != nil {
		return fmt.Errorf("create vif %s for %s: %w", vifName, vm, err)
	}
	if onBridge {
		br, err := hh.LinkByName("br0")
		if err != nil {
			return err
		}
		if err := hh.LinkSetMaster(veth, br); err != nil {
			return err
		}
	}
	// eth0 up: the VM is ready to talk; it has no carrier until the vif
	// comes up.
	return setLinkUp(vmNS, VMInterface, true)
}

// addressVM gives a VM with a static address its address and default route.
func addressVM(vmNS, vm string, v intent.VM) error {
	ip, err := netip.ParseAddr(v.IP)
	if err != nil {
		return fmt.Errorf("vm %s: address %q: %w", vm, v.IP, err)
	}
	vh, err := netns.Handle(vmNS)
	if err != nil {
		return err
	}
	defer vh.Close()
	eth, err := vh.LinkByName(VMInterface)
	if err != nil {
		return err
	}
	// The subnet's length is the cloud's plan's (read from the store when
	// the controller answered: waitStore).
	if err := vh.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(ip.String(), addrplan.Current().SubnetBitsLen())}); err != nil {
		return fmt.Errorf("vm %s address: %w", vm, err)
	}
	gw := net.ParseIP(v.Gateway)
	if err := vh.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw}); err != nil {
		return fmt.Errorf("vm %s default route via %s: %w", vm, gw, err)
	}
	return nil
}
