package lab

import (
	"context"
	"fmt"
	"net"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/topology"
)

// sliverKind is a guest that shares its host's public address and MAC and is
// told apart by the ports it leases (port-space isolation): a namespace with
// eth<k> for each uplink k it leases ports on, carrying the host's uplink-k
// address (same prefix length, so a connected route to the fabric) and the
// host's uplink-k MAC. eth<k> is one end of a veth pair whose other end,
// s<k>-NAME, lives in the host's namespace, where the host's datapath takes
// what the sliver sends and steers to it what arrives for its ports. Like a
// VM's vif, s<k>-NAME is made down and comes up only once the datapath is
// on it: a frame from the sliver that reached the host's own stack would
// come from the host's own address. Its processes live in the cgroup
// HOSTDIR/NAME (cgroup.go), where its host's agent confines bind/connect to
// its lease.
type sliverKind struct{}

// SliverInterface is a sliver's NIC on uplink k: eth0, eth1, ...
func SliverInterface(k int) string { return fmt.Sprintf("eth%d", k) }

func (sliverKind) kind() string { return "sliver" }

func (sliverKind) nodes(t *topology.File) []string {
	ss := t.Slivers()
	out := make([]string, 0, len(ss))
	for _, s := range ss {
		out = append(out, s.Name)
	}
	return out
}

func (sliverKind) plumb(_ context.Context, b *builder, node string) error {
	s, _ := b.t.SliverByName(node)
	b.step("sliver %s on %s: ports %s, the host's own address and MAC on %d link(s)", s.Name, s.Host, s.Ports, len(s.Uplinks()))
	return plumbSliver(b.st, s.Intent())
}

// notReady waits, in an onehop lab, for the sliver's host to have its
// datapath on every link of the sliver.
func (sliverKind) notReady(ctx context.Context, b *builder, node string) (string, error) {
	if b.t.Datapath != topology.DatapathOnehop {
		return "", nil
	}
	s, _ := b.t.SliverByName(node)
	st, err := b.store()
	if err != nil {
		return "", err
	}
	d, as, err := agentReport(ctx, st, s.Host)
	if err != nil {
		return err.Error(), nil // the store may be busy: ask again
	}
	return sliverNotReady(b.st, d, as, s.Host, s.Name, sliverLinks(s.Intent()))
}

// activate brings the sliver's host-side links up: the datapath is on them
// (the kernel confirms it, in an onehop lab).
func (sliverKind) activate(_ context.Context, b *builder, node string) error {
	s, _ := b.t.SliverByName(node)
	return activateSliver(b.st, s.Intent(), b.t.Datapath == topology.DatapathOnehop)
}

func (sliverKind) report(n *NodeReport, f *statusFacts) { n.Sliver = f.slivers[n.Name] }

// remove removes every sliver's cgroup (killing what still runs in it) and
// the lab's cgroup2 mount.
func (sliverKind) remove(st *State, say func(string, ...any)) error { return removeCgroups(st, say) }

// sliverLinks are the host-side links of s, one per uplink it leases on.
func sliverLinks(s intent.Sliver) []string {
	var out []string
	for _, k := range s.Uplinks() {
		out = append(out, intent.SliverIfname(s.Name, k))
	}
	return out
}

// sliverWaitsFor says what host's agent has yet to do before the links of
// sliver are under its datapath, "" when nothing: the controller's desired
// state for the host lists the sliver, the agent has applied that very
// state, and it misses none of the links. (The kernel is asked too: see
// sliverNotReady.)
func sliverWaitsFor(d *intent.Desired, st *intent.AgentStatus, sliver string, links []string) string {
	switch {
	case d == nil:
		return "no desired state from the controller yet"
	case st == nil:
		return "agent has not reported yet"
	case st.Error != "":
		return "agent: " + st.Error
	}
	if !slices.ContainsFunc(d.Slivers, func(l intent.LocalSliver) bool { return l.Name == sliver }) {
		return fmt.Sprintf("the controller has not placed sliver %s here yet", sliver)
	}
	if st.AppliedDigest != d.Digest() {
		return "agent has not applied the latest desired state"
	}
	for _, l := range links {
		if slices.Contains(st.MissingVifs, l) {
			return fmt.Sprintf("datapath not yet on %s (the agent misses it)", l)
		}
	}
	return ""
}

// sliverNotReady is sliverWaitsFor, then the kernel's word that a program
// sits on each link's tcx ingress.
func sliverNotReady(st *State, d *intent.Desired, as *intent.AgentStatus, host, sliver string, links []string) (string, error) {
	if why := sliverWaitsFor(d, as, sliver, links); why != "" {
		return why, nil
	}
	for _, l := range links {
		on, err := tcxAttached(NamespaceOf(st.Name, host), l)
		if err != nil {
			return "", err
		}
		if !on {
			return fmt.Sprintf("the agent is done, the kernel shows no program on %s yet", l), nil
		}
	}
	return "", nil
}

// plumbSliver makes sliver s of lab st: its namespace and cgroup, recorded
// in the state first so that a teardown finds them, and its links, the
// host-side ends down.
func plumbSliver(st *State, s intent.Sliver) error {
	hostNS := NamespaceOf(st.Name, s.Host)
	if st.Kinds[s.Host] != "host" || !netns.Exists(hostNS) {
		return fmt.Errorf("sliver %s: lab %q has no host %q", s.Name, st.Name, s.Host)
	}
	uplinks := s.Uplinks()
	if len(uplinks) == 0 {
		return fmt.Errorf("sliver %s: no leases, so no link to make", s.FullName())
	}
	// The host's public side first: a sliver on an uplink the host lacks
	// is refused before anything is made.
	pub := make(map[int]publicSide, len(uplinks))
	for _, k := range uplinks {
		p, err := hostPublicSide(hostNS, k)
		if err != nil {
			return fmt.Errorf("sliver %s: %w", s.FullName(), err)
		}
		pub[k] = p
	}
	ns, err := newNamespace(st, s.Name, "sliver")
	if err != nil {
		return err
	}
	st.Slivers = append(st.Slivers, s)
	if err := st.save(); err != nil {
		return err
	}
	if err := ensureCgroup(st, SliverCgroupDir(st, s.Host, s.Name)); err != nil {
		return err
	}
	for _, k := range uplinks {
		if err := plugSliver(hostNS, ns, s.Name, k, pub[k]); err != nil {
			return err
		}
	}
	return nil
}

// publicSide is what a host's uplink shows the fabric: its MAC and address.
type publicSide struct {
	mac  net.HardwareAddr
	addr *net.IPNet
}

// hostPublicSide reads the MAC and IPv4 address of host namespace ns's
// uplink k. In a bridge lab uplink 0's address sits on the host bridge,
// which carries the uplink's MAC (hostBridge).
func hostPublicSide(ns string, k int) (publicSide, error) {
	h, err := netns.Handle(ns)
	if err != nil {
		return publicSide{}, err
	}
	defer h.Close()
	name := topology.UplinkName(k)
	l, err := h.LinkByName(name)
	if err != nil {
		return publicSide{}, fmt.Errorf("host has no %s (a lease on uplink %d needs uplinks: %d or more on the host): %w", name, k, k+1, err)
	}
	carrier := l
	if m := l.Attrs().MasterIndex; m != 0 {
		if carrier, err = h.LinkByIndex(m); err != nil {
			return publicSide{}, fmt.Errorf("bridge of %s in %s: %w", name, ns, err)
		}
	}
	addrs, err := h.AddrList(carrier, unix.AF_INET)
	if err != nil {
		return publicSide{}, fmt.Errorf("addresses of %s in %s: %w", carrier.Attrs().Name, ns, err)
	}
	if len(addrs) == 0 {
		return publicSide{}, fmt.Errorf("%s in %s has no IPv4 address", carrier.Attrs().Name, ns)
	}
	return publicSide{mac: l.Attrs().HardwareAddr, addr: addrs[0].IPNet}, nil
}

// plugSliver makes the sliver's link on uplink k: eth<k> in sliverNS with
// the host's MAC and address, up; s<k>-NAME in hostNS, down.
func plugSliver(hostNS, sliverNS, sliver string, k int, pub publicSide) error {
	sfd, err := netns.Fd(sliverNS)
	if err != nil {
		return err
	}
	defer sfd.Close()
	hh, err := netns.Handle(hostNS)
	if err != nil {
		return err
	}
	defer hh.Close()
	hostEnd, inner := intent.SliverIfname(sliver, k), SliverInterface(k)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostEnd}, PeerName: inner,
		PeerHardwareAddr: pub.mac, PeerNamespace: netlink.NsFd(int(sfd))}
	if err := hh.LinkAdd(veth); err != nil {
		return fmt.Errorf("create %s for sliver %s: %w", hostEnd, sliver, err)
	}
	sh, err := netns.Handle(sliverNS)
	if err != nil {
		return err
	}
	defer sh.Close()
	l, err := sh.LinkByName(inner)
	if err != nil {
		return fmt.Errorf("%s in %s: %w", inner, sliverNS, err)
	}
	// The host's own address and prefix: the kernel adds the connected
	// route to the fabric with it.
	if err := sh.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: pub.addr.IP, Mask: pub.addr.Mask}}); err != nil {
		return fmt.Errorf("address %s on %s of sliver %s: %w", pub.addr, inner, sliver, err)
	}
	// Up: the sliver is ready to talk; it has no carrier until the host's
	// end comes up.
	if err := sh.LinkSetUp(l); err != nil {
		return fmt.Errorf("bring up %s of sliver %s: %w", inner, sliver, err)
	}
	return nil
}

// activateSliver brings s's host-side links up; with datapath, only once
// the kernel shows a program on each.
func activateSliver(st *State, s intent.Sliver, datapath bool) error {
	hostNS := NamespaceOf(st.Name, s.Host)
	for _, l := range sliverLinks(s) {
		if datapath {
			on, err := tcxAttached(hostNS, l)
			if err != nil {
				return err
			}
			if !on {
				return fmt.Errorf("sliver %s: %s's agent is done, yet no program is on %s; left down", s.Name, s.Host, l)
			}
		}
		if err := setLinkUp(hostNS, l, true); err != nil {
			return err
		}
	}
	return nil
}
