// Package cnilink makes, reads and removes the links of onehop's CNI plugin
// (cni.Links): a veth whose host end stays down for the agent, and whose
// other end is in the container's namespace with the VM's MAC, address
// and default route. Every call into the container's namespace goes
// through a netlink handle bound to it: no thread changes namespace.
package cnilink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/cni"
)

// Links implements cni.Links in the calling process's network namespace
// (the host's, where its agent runs).
type Links struct{}

var _ cni.Links = Links{}

// NetnsExists implements cni.Links.
func (Links) NetnsExists(path string) bool {
	h, err := netns.GetFromPath(path)
	if err != nil {
		return false
	}
	h.Close()
	return true
}

// inNetns is a netlink handle bound to the namespace at path.
func inNetns(path string) (*netlink.Handle, netns.NsHandle, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, 0, fmt.Errorf("network namespace %s: %w", path, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, 0, fmt.Errorf("netlink in %s: %w", path, err)
	}
	return h, ns, nil
}

// Add implements cni.Links. The veth is made with its peer in the
// container's namespace at once, so no link named IfName ever appears on
// the host; the host end is left down: only the agent brings it up, once
// its program is on it (docs/guests.md, "Before the program is attached").
func (Links) Add(s cni.LinkSpec) (string, error) {
	mac, err := net.ParseMAC(s.MAC)
	if err != nil {
		return "", fmt.Errorf("MAC %q: %w", s.MAC, err)
	}
	h, ns, err := inNetns(s.Netns)
	if err != nil {
		return "", err
	}
	defer ns.Close()
	defer h.Close()
	if self, err := netns.Get(); err == nil {
		same := self.Equal(ns)
		self.Close()
		if same {
			return "", fmt.Errorf("%s is the host's own network namespace, not a container's", s.Netns)
		}
	}
	if _, err := h.LinkByName(s.IfName); err == nil {
		return "", fmt.Errorf("%s already has an interface %s", s.Netns, s.IfName)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: s.HostIf}, PeerName: s.IfName,
		PeerHardwareAddr: mac, PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return "", fmt.Errorf("the host already has an interface %s (or %s holds %s): %w", s.HostIf, s.Netns, s.IfName, err)
		}
		return "", err
	}
	host, err := netlink.LinkByName(s.HostIf)
	if err != nil {
		return "", err
	}
	peer, err := h.LinkByName(s.IfName)
	if err != nil {
		return "", fmt.Errorf("%s in %s: %w", s.IfName, s.Netns, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: s.Address.Addr().AsSlice(), Mask: net.CIDRMask(s.Address.Bits(), 32)}}
	if err := h.AddrAdd(peer, addr); err != nil {
		return "", fmt.Errorf("address %s on %s: %w", s.Address, s.IfName, err)
	}
	// Up now: it has no carrier, and sends nothing anywhere, until the
	// agent brings the host end up.
	if err := h.LinkSetUp(peer); err != nil {
		return "", fmt.Errorf("bring %s up: %w", s.IfName, err)
	}
	gw := s.Gateway.AsSlice()
	if err := h.RouteAdd(&netlink.Route{LinkIndex: peer.Attrs().Index, Gw: gw}); err != nil {
		return "", fmt.Errorf("default route via %s on %s: %w", s.Gateway, s.IfName, err)
	}
	return host.Attrs().HardwareAddr.String(), nil
}

// WaitUp implements cni.Links: it follows link changes on the host until
// hostIf is up, then in the container's namespace until ifname is
// operationally up. The agent sets hostIf up only after attaching its
// program and writing the VM's entries (agent.Router.bringUp). That gives
// the container's end its carrier, but the kernel activates that end's
// transmit queue later, from a work queue (linkwatch), and drops what the
// end sends before (its TX dropped): a container started at once would
// lose its first ARP request and wait a second for the next. The
// activation is what makes the end operationally up, so up and
// operationally up means the container can talk.
func (Links) WaitUp(ctx context.Context, hostIf, netnsPath, ifname string) error {
	ns, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", netnsPath, err)
	}
	defer ns.Close()
	// Both followed before the first read: a change between the two is
	// not lost.
	onHost, err := follow(nil)
	if err != nil {
		return fmt.Errorf("follow link changes: %w", err)
	}
	defer onHost.stop()
	inCtr, err := follow(&ns)
	if err != nil {
		return fmt.Errorf("follow link changes in %s: %w", netnsPath, err)
	}
	defer inCtr.stop()
	hostUp := func(l netlink.Link) bool { return l.Attrs().Flags&net.FlagUp != 0 }
	if err := onHost.until(ctx, hostIf, hostUp, func() (netlink.Link, error) { return netlink.LinkByName(hostIf) }); err != nil {
		return fmt.Errorf("%w (%s)", err, stateOf(err, "it is still down"))
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", netnsPath, err)
	}
	defer h.Close()
	operUp := func(l netlink.Link) bool { return l.Attrs().OperState == netlink.OperUp }
	if err := inCtr.until(ctx, ifname, operUp, func() (netlink.Link, error) { return h.LinkByName(ifname) }); err != nil {
		return fmt.Errorf("%s is up but %s in %s cannot send yet: %w (%s)", hostIf, ifname, netnsPath, err, stateOf(err, "not operationally up"))
	}
	return nil
}

// errGone is a link that went while WaitUp waited for it.
var errGone = errors.New("it is gone")

// stateOf says what a wait's error found: errGone's words, or otherwise.
func stateOf(err error, otherwise string) string {
	if errors.Is(err, errGone) {
		return "it is gone"
	}
	return otherwise
}

// linkEvents are the link changes of one namespace.
type linkEvents struct {
	updates chan netlink.LinkUpdate
	errs    chan error
	done    chan struct{}
}

// follow subscribes to the link changes of ns (nil: the caller's own).
func follow(ns *netns.NsHandle) (*linkEvents, error) {
	ev := &linkEvents{updates: make(chan netlink.LinkUpdate, 64), errs: make(chan error, 1), done: make(chan struct{})}
	err := netlink.LinkSubscribeWithOptions(ev.updates, ev.done, netlink.LinkSubscribeOptions{
		Namespace: ns,
		ErrorCallback: func(err error) {
			select {
			case ev.errs <- err:
			default:
			}
		}})
	if err != nil {
		return nil, err
	}
	return ev, nil
}

// stop ends the subscription, draining what is still sent.
func (ev *linkEvents) stop() {
	close(ev.done)
	go func() {
		for range ev.updates {
		}
	}()
}

// until returns once name is ready: as read now, or in a change that
// follows; or ctx's error, or errGone if the link is not there when ctx
// ends.
func (ev *linkEvents) until(ctx context.Context, name string, ready func(netlink.Link) bool, read func() (netlink.Link, error)) error {
	if l, err := read(); err == nil && ready(l) {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			if _, err := read(); err != nil {
				return fmt.Errorf("%w: %w", ctx.Err(), errGone)
			}
			return ctx.Err()
		case err := <-ev.errs:
			return fmt.Errorf("link changes: %w", err)
		case u, ok := <-ev.updates:
			if !ok {
				return errors.New("link changes: subscription ended")
			}
			if u.Link != nil && u.Link.Attrs().Name == name && u.Header.Type == unix.RTM_NEWLINK && ready(u.Link) {
				return nil
			}
		}
	}
}

// Delete implements cni.Links. Removing the host end removes its peer; the
// peer is looked for in netns too, for a host end that went on its own.
func (Links) Delete(hostIf, netnsPath, ifname string) error {
	if l, err := netlink.LinkByName(hostIf); err == nil {
		if _, ok := l.(*netlink.Veth); !ok {
			return fmt.Errorf("host interface %s is a %s, not the veth this plugin made: left alone", hostIf, l.Type())
		}
		if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("remove %s: %w", hostIf, err)
		}
	} else if !isNotFound(err) {
		return fmt.Errorf("interface %s: %w", hostIf, err)
	}
	if netnsPath == "" {
		return nil
	}
	h, ns, err := inNetns(netnsPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer ns.Close()
	defer h.Close()
	l, err := h.LinkByName(ifname)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s in %s: %w", ifname, netnsPath, err)
	}
	if _, ok := l.(*netlink.Veth); !ok {
		return nil // not ours: another plugin's interface of this name
	}
	if err := h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("remove %s in %s: %w", ifname, netnsPath, err)
	}
	return nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// Inspect implements cni.Links.
func (Links) Inspect(hostIf, netnsPath, ifname string) (cni.LinkState, error) {
	var st cni.LinkState
	host, err := netlink.LinkByName(hostIf)
	if isNotFound(err) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("interface %s: %w", hostIf, err)
	}
	st.HostKind = host.Type()
	st.HostUp = host.Attrs().Flags&net.FlagUp != 0
	h, ns, err := inNetns(netnsPath)
	if err != nil {
		return st, err
	}
	defer ns.Close()
	defer h.Close()
	peer, err := h.LinkByName(ifname)
	if isNotFound(err) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("%s in %s: %w", ifname, netnsPath, err)
	}
	peerIdx, err := netlink.VethPeerIndex(&netlink.Veth{LinkAttrs: *host.Attrs()})
	if err != nil {
		return st, fmt.Errorf("peer of %s: %w", hostIf, err)
	}
	if peerIdx != peer.Attrs().Index {
		return st, nil // an interface of that name, but not this veth's other end
	}
	st.PeerFound = true
	st.PeerMAC = peer.Attrs().HardwareAddr.String()
	addrs, err := h.AddrList(peer, netlink.FAMILY_V4)
	if err != nil {
		return st, fmt.Errorf("addresses of %s: %w", ifname, err)
	}
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP.To4())
		ones, _ := a.Mask.Size()
		st.Addrs = append(st.Addrs, netip.PrefixFrom(ip, ones))
	}
	routes, err := h.RouteList(peer, netlink.FAMILY_V4)
	if err != nil {
		return st, fmt.Errorf("routes of %s: %w", ifname, err)
	}
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw != nil {
			st.Gateway, _ = netip.AddrFromSlice(r.Gw.To4())
		}
	}
	return st, nil
}
