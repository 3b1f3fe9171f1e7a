package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// Re-addressing: a node that changes address while its processes and
// sockets stay, as an endpoint that VNAT (issue 10) keeps connected does. A
// VM changes address by moving to another subnet (Move with a subnet); an
// external by Readdress. Either way only the node's interface changes: its
// new address, MAC and route go on and its old address comes off (the VNAT
// daemon keeps that one local to the node's own sockets, not the lab), and
// nothing in its namespace is restarted.

// checkSubnetMove refuses, before anything is touched, a subnet move the
// lab can tell is wrong on its own: a subnet not written FARM/SUBNET, the
// VM's own subnet, a subnet of another farm (the controller refuses those
// too, and a subnet that does not exist; see controller.checkSubnetMove).
func checkSubnetMove(vm intent.VM, to string) error {
	farm, subnet, ok := strings.Cut(to, "/")
	switch {
	case !ok || farm == "" || subnet == "" || strings.Contains(subnet, "/"):
		return fmt.Errorf("--subnet %q must be FARM/SUBNET, e.g. %s/db", to, vm.Farm)
	case farm != vm.Farm:
		return fmt.Errorf("vm %s is in farm %s and cannot move to %s: a VM moves only within its farm", vm.Name, vm.Farm, to)
	case subnet == vm.Subnet:
		return fmt.Errorf("vm %s is already in subnet %s: leave out --subnet to move it to another host only", vm.Name, to)
	}
	return nil
}

// subnetExists asks the controller's store whether FARM/SUBNET exists.
func subnetExists(st *State, subnet string) error {
	s, err := dialStore(st)
	if err != nil {
		return err
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	farm, _, _ := strings.Cut(subnet, "/")
	switch _, err := s.Get(ctx, intent.SubnetsPrefix+subnet); {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("no subnet %q in farm %s", subnet, farm)
	case err != nil:
		return fmt.Errorf("read subnet %s from the controller's store: %w", subnet, err)
	}
	return nil
}

// readdressVM gives the VM's eth0 the moved record's MAC, address and
// default route, and takes its old address off. An eth0 that does not hold
// the old address (a DHCP VM that has not asked yet) gets the MAC only: its
// DHCP client asks the new host, which answers with the new address. Every
// step is a netlink change to the one link: sockets, and the processes that
// own them, are left alone.
func readdressVM(vmNS string, old, moved intent.VM) error {
	mac, err := net.ParseMAC(moved.MAC)
	if err != nil {
		return fmt.Errorf("MAC %q: %w", moved.MAC, err)
	}
	oldIP, err := netip.ParseAddr(old.IP)
	if err != nil {
		return fmt.Errorf("old address %q: %w", old.IP, err)
	}
	h, err := netns.Handle(vmNS)
	if err != nil {
		return err
	}
	defer h.Close()
	eth, err := h.LinkByName(VMInterface)
	if err != nil {
		return fmt.Errorf("%s in %s: %w", VMInterface, vmNS, err)
	}
	// A veth takes a new MAC while up (IFF_LIVE_ADDR_CHANGE): no down and
	// up, which would flush the routes through it.
	if err := h.LinkSetHardwareAddr(eth, mac); err != nil {
		return fmt.Errorf("MAC %s on %s in %s: %w", mac, VMInterface, vmNS, err)
	}
	addrs, err := h.AddrList(eth, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("addresses of %s in %s: %w", VMInterface, vmNS, err)
	}
	i := slices.IndexFunc(addrs, func(a netlink.Addr) bool { return a.IP.Equal(oldIP.AsSlice()) })
	if i < 0 {
		return nil
	}
	// The new address has the old one's length: the cloud's plan's.
	bits, _ := addrs[i].Mask.Size()
	ip, err := netip.ParseAddr(moved.IP)
	if err != nil {
		return fmt.Errorf("new address %q: %w", moved.IP, err)
	}
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(ip.String(), bits)}); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("address %s/%d on %s in %s: %w", ip, bits, VMInterface, vmNS, err)
	}
	// Replaced, not added: the default route via the old gateway is there
	// until the old address goes.
	gw := net.ParseIP(moved.Gateway)
	if err := h.RouteReplace(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw}); err != nil {
		return fmt.Errorf("default route via %s in %s: %w", gw, vmNS, err)
	}
	for _, a := range addrs {
		if !a.IP.Equal(oldIP.AsSlice()) {
			continue
		}
		if err := h.AddrDel(eth, &a); err != nil {
			return fmt.Errorf("remove old address %s from %s in %s: %w", a.IPNet, VMInterface, vmNS, err)
		}
	}
	return nil
}

// Readdress gives external node a new fabric address, allocated as the
// topology allocates externals' (topology.NextFabricAddr, from the same
// offset) and never one the lab has used: not one on any node now, nor one a
// node had before a readdress (State.Readdressed). The new address goes on
// the node's eth0 before the old one comes off, so the node is never without
// one; nothing in its namespace restarts. It returns the old and the new
// address.
//
// VMs are not readdressed this way: a VM's address is the controller's to
// give, and it gets a new one by moving to another subnet (Move).
func Readdress(st *State, node string) (old, fresh netip.Prefix, err error) {
	switch kind := st.Kinds[node]; kind {
	case "external":
	case "vm":
		return old, fresh, fmt.Errorf("%s is a VM: its address is the controller's; give it a new one with `onehop lab move %s --to HOST --subnet FARM/SUBNET`", node, node)
	case "":
		return old, fresh, fmt.Errorf("lab %q has no node %q", st.Name, node)
	default:
		return old, fresh, fmt.Errorf("%s is a %s: only externals are readdressed (a %s's address is part of the lab's plumbing)", node, kind, kind)
	}
	ns := NamespaceOf(st.Name, node)
	h, err := netns.Handle(ns)
	if err != nil {
		return old, fresh, err
	}
	defer h.Close()
	eth, err := h.LinkByName(ExternalInterface)
	if err != nil {
		return old, fresh, fmt.Errorf("%s in %s: %w", ExternalInterface, ns, err)
	}
	addrs, err := h.AddrList(eth, netlink.FAMILY_V4)
	if err != nil {
		return old, fresh, fmt.Errorf("addresses of %s in %s: %w", ExternalInterface, ns, err)
	}
	if len(addrs) != 1 {
		return old, fresh, fmt.Errorf("%s's %s holds %d IPv4 addresses, want its one fabric address", node, ExternalInterface, len(addrs))
	}
	old = prefixOf(addrs[0].IPNet)
	used, err := fabricAddrsInUse(st)
	if err != nil {
		return old, fresh, err
	}
	a, ok := topology.NextFabricAddr(old.Masked(), externalOffset(st), func(a netip.Addr) bool { return used[a] })
	if !ok {
		return old, fresh, fmt.Errorf("no fabric address left for %s on %s: every one is in use or was used before", node, old.Masked())
	}
	fresh = netip.PrefixFrom(a, old.Bits())
	// Recorded first, so a readdress cut short never hands the address out
	// twice.
	if st.Readdressed == nil {
		st.Readdressed = map[string][]string{}
	}
	if len(st.Readdressed[node]) == 0 {
		st.Readdressed[node] = []string{old.Addr().String()}
	}
	st.Readdressed[node] = append(st.Readdressed[node], a.String())
	if err := st.save(); err != nil {
		return old, fresh, err
	}
	// The new address shares the old one's subnet, so the kernel makes it
	// a secondary; deleting the primary would take its secondaries with it
	// unless they are promoted.
	if err := netns.WriteSysctl(ns, "net/ipv4/conf/"+ExternalInterface+"/promote_secondaries", "1"); err != nil {
		return old, fresh, err
	}
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(a.String(), fresh.Bits())}); err != nil {
		return old, fresh, fmt.Errorf("address %s on %s in %s: %w", fresh, ExternalInterface, ns, err)
	}
	if err := h.AddrDel(eth, &addrs[0]); err != nil {
		return old, fresh, fmt.Errorf("remove old address %s from %s in %s: %w", old, ExternalInterface, ns, err)
	}
	return old, fresh, nil
}

// externalOffset is where the topology starts allocating externals'
// addresses: the 10th address of the fabric, after one per host.
func externalOffset(st *State) int {
	hosts := 0
	for _, k := range st.Kinds {
		if k == "host" {
			hosts++
		}
	}
	return 10 + hosts
}

// fabricAddrsInUse are the addresses on every interface of every node of
// the lab now, and every address a readdressed node ever had.
func fabricAddrsInUse(st *State) (map[netip.Addr]bool, error) {
	used := map[netip.Addr]bool{}
	for _, ns := range st.Namespaces {
		if !netns.Exists(ns) {
			continue
		}
		h, err := netns.Handle(ns)
		if err != nil {
			return nil, err
		}
		addrs, err := h.AddrList(nil, netlink.FAMILY_V4)
		h.Close()
		if err != nil {
			return nil, fmt.Errorf("addresses in %s: %w", ns, err)
		}
		for _, a := range addrs {
			used[prefixOf(a.IPNet).Addr()] = true
		}
	}
	for _, hist := range st.Readdressed {
		for _, s := range hist {
			if a, err := netip.ParseAddr(s); err == nil {
				used[a] = true
			}
		}
	}
	return used, nil
}

func prefixOf(n *net.IPNet) netip.Prefix {
	a, _ := netip.AddrFromSlice(n.IP.To4())
	bits, _ := n.Mask.Size()
	return netip.PrefixFrom(a, bits)
}
