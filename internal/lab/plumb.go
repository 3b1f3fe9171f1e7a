package lab

import (
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/topology"
)

// Namespaces and links: what every kind plumbs with.

// newNamespace makes the namespace of node, a node of kind, and records it
// in the state before anything goes into it, so a teardown finds it.
func (b *builder) newNamespace(node, kind string) (string, error) {
	return newNamespace(b.st, node, kind)
}

// newNamespace makes the namespace of node in lab st (see builder's), for
// what adds nodes to a lab that is up (AddSliver).
func newNamespace(st *State, node, kind string) (string, error) {
	name := NamespaceOf(st.Name, node)
	if err := netns.Create(name); err != nil {
		return "", err
	}
	st.Namespaces = append(st.Namespaces, name)
	if st.Kinds == nil {
		st.Kinds = map[string]string{}
	}
	st.Kinds[node] = kind
	if err := st.save(); err != nil {
		return "", err
	}
	// The lab carries IPv4 only; IPv6 autoconfiguration would put router
	// solicitations and DAD on the fabric and in the drop counters.
	for _, k := range []string{"net/ipv6/conf/default/disable_ipv6", "net/ipv6/conf/all/disable_ipv6"} {
		if err := netns.WriteSysctl(name, k, "1"); err != nil {
			return "", err
		}
	}
	return name, nil
}

// plugIntoFabric connects namespace ns to the fabric bridge with a veth pair
// (fabricEnd on the bridge, inner inside ns) and gives inner addr/bits.
func (b *builder) plugIntoFabric(ns, fabricEnd, inner, addr string, bits int) error {
	fh := b.fabric
	nsFd, err := netns.Fd(ns)
	if err != nil {
		return err
	}
	defer nsFd.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fabricEnd}, PeerName: inner, PeerNamespace: netlink.NsFd(int(nsFd))}
	if err := fh.LinkAdd(veth); err != nil {
		return fmt.Errorf("create %s<->%s: %w", fabricEnd, inner, err)
	}
	br, err := fh.LinkByName(FabricBridge)
	if err != nil {
		return err
	}
	if err := fh.LinkSetMaster(veth, br); err != nil {
		return fmt.Errorf("attach %s to fabric: %w", fabricEnd, err)
	}
	if err := fh.LinkSetMulticastOff(veth); err != nil {
		return fmt.Errorf("%s: %w", fabricEnd, err)
	}
	h, err := netns.Handle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(inner)
	if err != nil {
		return fmt.Errorf("%s in %s: %w", inner, ns, err)
	}
	// Bound before the port comes up, so not one frame is learned.
	if b.t.Datapath == topology.DatapathOnehop {
		if err := bindPort(fh, NamespaceOf(b.st.Name, "fabric"), veth, l.Attrs().HardwareAddr); err != nil {
			return err
		}
	}
	if err := fh.LinkSetUp(veth); err != nil {
		return err
	}
	if addr != "" {
		if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(addr, bits)}); err != nil {
			return fmt.Errorf("address %s on %s in %s: %w", addr, inner, ns, err)
		}
	}
	return h.LinkSetUp(l)
}

// bindPort makes port what a correctly configured switch's port is (the
// fabric is shared with nodes that are no hosts, and a host's MAC is its
// only identity there: docs/security.md): it learns nothing, and takes a
// frame only when its source MAC is mac, the one station plugged into it.
// A locked port (IFLA_BRPORT_LOCKED, Linux 5.18) drops, without moving the
// entry, a frame whose source MAC has no FDB entry pointing to the port; the
// static entry is the only one it has. No MAB: nothing is ever learned.
func bindPort(fh *netlink.Handle, fabricNS string, port netlink.Link, mac net.HardwareAddr) error {
	name := port.Attrs().Name
	err := netns.Do(fabricNS, func() error {
		// netlink has no setter for the locked flag: one RTM_SETLINK with
		// both port flags, on this thread's namespace (the fabric's).
		req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
		msg := nl.NewIfInfomsg(unix.AF_BRIDGE)
		msg.Index = int32(port.Attrs().Index)
		req.AddData(msg)
		info := nl.NewRtAttr(unix.IFLA_PROTINFO|unix.NLA_F_NESTED, nil)
		info.AddRtAttr(nl.IFLA_BRPORT_LEARNING, []byte{0})
		info.AddRtAttr(nl.IFLA_BRPORT_LOCKED, []byte{1})
		req.AddData(info)
		_, err := req.Execute(unix.NETLINK_ROUTE, 0)
		return err
	})
	if err != nil {
		return fmt.Errorf("lock fabric port %s (learning off, locked on): %w", name, err)
	}
	// Static (NUD_NOARP), not permanent: a permanent entry is the bridge's
	// own address, and frames to it would stop at the bridge.
	fdb := &netlink.Neigh{LinkIndex: port.Attrs().Index, Family: unix.AF_BRIDGE, Flags: netlink.NTF_MASTER,
		State: netlink.NUD_NOARP, HardwareAddr: mac}
	if err := fh.NeighSet(fdb); err != nil {
		return fmt.Errorf("bind %s to fabric port %s (static FDB entry): %w", mac, name, err)
	}
	return nil
}

// setLinkUp brings ifname in namespace ns up or down.
func setLinkUp(ns, ifname string, up bool) error {
	h, err := netns.Handle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("%s in %s: %w", ifname, ns, err)
	}
	if up {
		err = h.LinkSetUp(l)
	} else {
		err = h.LinkSetDown(l)
	}
	if err != nil {
		return fmt.Errorf("set %s in %s up=%v: %w", ifname, ns, up, err)
	}
	return nil
}

// linkUp reports whether ifname in namespace ns is administratively up.
func linkUp(ns, ifname string) (bool, error) {
	h, err := netns.Handle(ns)
	if err != nil {
		return false, err
	}
	defer h.Close()
	l, err := h.LinkByName(ifname)
	if err != nil {
		return false, fmt.Errorf("%s in %s: %w", ifname, ns, err)
	}
	return l.Attrs().Flags&net.FlagUp != 0, nil
}

// moveLink moves ifname from namespace from to namespace to. The kernel
// takes a link down when it changes namespace; it stays down until set up.
func moveLink(from, to, ifname string) error {
	fh, err := netns.Handle(from)
	if err != nil {
		return err
	}
	defer fh.Close()
	l, err := fh.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("%s in %s: %w", ifname, from, err)
	}
	// Down first, so it is down in the new namespace whatever the kernel
	// does on the way.
	if err := fh.LinkSetDown(l); err != nil {
		return fmt.Errorf("take %s down in %s: %w", ifname, from, err)
	}
	toFd, err := netns.Fd(to)
	if err != nil {
		return err
	}
	defer toFd.Close()
	if err := fh.LinkSetNsFd(l, int(toFd)); err != nil {
		return fmt.Errorf("move %s from %s to %s: %w", ifname, from, to, err)
	}
	return nil
}

// tcxAttached reports whether a program sits on ifname's tcx ingress in
// namespace ns. The kernel drops a link's tcx programs when the link changes
// namespace, so on a vif just moved this is the new host's own datapath.
func tcxAttached(ns, ifname string) (bool, error) {
	var n int
	err := netns.Do(ns, func() error {
		l, err := netlink.LinkByName(ifname) // this thread is in ns
		if err != nil {
			return fmt.Errorf("%s in %s: %w", ifname, ns, err)
		}
		r, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return fmt.Errorf("tcx programs of %s in %s: %w", ifname, ns, err)
		}
		n = len(r.Programs)
		return nil
	})
	return n > 0, err
}

// hostBridge makes a bridge-mode host: uplink and vifs on one Linux bridge
// that carries the host's address, as a hypervisor without onehop would.
func hostBridge(ns, addr string, bits int) error {
	h, err := netns.Handle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := h.LinkAdd(br); err != nil {
		return fmt.Errorf("host bridge in %s: %w", ns, err)
	}
	up, err := h.LinkByName(HostUplink)
	if err != nil {
		return err
	}
	// The bridge answers for the host's address with the uplink's MAC, as
	// the uplink itself does in an onehop lab. Left to itself it would take
	// the lowest MAC among its ports, which changes as vifs join it, and
	// the host's slivers carry this MAC.
	if err := h.LinkSetHardwareAddr(br, up.Attrs().HardwareAddr); err != nil {
		return fmt.Errorf("host bridge MAC in %s: %w", ns, err)
	}
	if err := h.LinkSetMaster(up, br); err != nil {
		return err
	}
	if err := h.AddrAdd(br, &netlink.Addr{IPNet: ipNet(addr, bits)}); err != nil {
		return err
	}
	return h.LinkSetUp(br)
}

func ipNet(addr string, bits int) *net.IPNet {
	return &net.IPNet{IP: net.ParseIP(addr).To4(), Mask: net.CIDRMask(bits, 32)}
}

// MountBPFFS mounts a bpffs at dir unless one is there already. The lab keeps
// it outside /sys because `ip netns exec` remounts /sys and would hide pins.
func MountBPFFS(dir string) error {
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err == nil && sfs.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := unix.Mount("bpffs", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", dir, err)
	}
	return nil
}

// unmountBPFFS unmounts every bpffs mounted at dir (a bpffs may have been
// mounted there more than once); it reports whether there was one.
func unmountBPFFS(dir string) (bool, error) {
	unmounted := false
	for i := 0; i < 8; i++ {
		var sfs unix.Statfs_t
		if unix.Statfs(dir, &sfs) != nil || sfs.Type != unix.BPF_FS_MAGIC {
			break
		}
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return unmounted, fmt.Errorf("unmount %s: %w", dir, err)
		}
		unmounted = true
	}
	return unmounted, nil
}

// multiHome makes a host with several links on one subnet (devs[k] carries
// addrs[k], all in fabric) behave as one per address: each address answers
// ARP only on its own link and announces itself with its own address
// (arp_ignore=1, arp_announce=2; without them every link answers for every
// address, "ARP flux"), and what leaves from an address leaves by its link
// (one routing table per link, chosen by source address). The main table
// keeps the kernel's connected routes for sockets that bind no address.
func multiHome(ns string, devs, addrs []string, fabric netip.Prefix) error {
	for _, kv := range [][2]string{{"net/ipv4/conf/all/arp_ignore", "1"}, {"net/ipv4/conf/all/arp_announce", "2"}} {
		if err := netns.WriteSysctl(ns, kv[0], kv[1]); err != nil {
			return err
		}
	}
	h, err := netns.Handle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	for k, dev := range devs {
		l, err := h.LinkByName(dev)
		if err != nil {
			return fmt.Errorf("%s in %s: %w", dev, ns, err)
		}
		src := net.ParseIP(addrs[k]).To4()
		table := uplinkTable + k
		dst := &net.IPNet{IP: fabric.Addr().AsSlice(), Mask: net.CIDRMask(fabric.Bits(), 32)}
		if err := h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Src: src, Table: table, Scope: netlink.SCOPE_LINK}); err != nil {
			return fmt.Errorf("route %s dev %s table %d in %s: %w", fabric, dev, table, ns, err)
		}
		r := netlink.NewRule()
		r.Src = &net.IPNet{IP: src, Mask: net.CIDRMask(32, 32)}
		r.Table = table
		r.Priority = table
		if err := h.RuleAdd(r); err != nil {
			return fmt.Errorf("rule from %s lookup %d in %s: %w", src, table, ns, err)
		}
	}
	return nil
}

// uplinkTable is the routing table of a multi-homed host's uplink 0; uplink
// k's is uplinkTable+k.
const uplinkTable = 100
