package vnat

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	onehopns "github.com/onehop/onehop/internal/netns"
)

// KeepLocal keeps addr a local address of this endpoint after its
// interface lost it, so the moved end's sockets (bound to it: it is their
// virtual address) can still send from it and receive translated packets
// for it — without announcing it where the endpoint now is, where the
// address may belong to someone else (paper §3.4.2):
//   - addr/32 on lo with noprefixroute: local (the kernel's local table
//     delivers it) but no prefix route and no interface on the wire holds it;
//   - arp_ignore=1 on ifname (and "all"): ARP requests are answered only for
//     addresses configured on the interface they arrive on, so nobody
//     learns addr's MAC here;
//   - arp_announce=2 on ifname (and "all"): the stack's own ARP requests use
//     the interface's primary address as sender, never addr (a socket bound
//     to addr would otherwise put it in the sender field).
//
// ifname is the endpoint's interface (the one the programs are attached to).
func (d *Kernel) KeepLocal(addr netip.Addr, ifname string) error {
	if !addr.Is4() || addr.IsUnspecified() || addr.IsMulticast() || addr.IsLoopback() {
		return fmt.Errorf("vnat: keep local %s: not an IPv4 unicast address", addr)
	}
	return onehopns.DoPath(d.opts.Netns, func() error {
		for _, dev := range []string{"all", ifname} {
			for key, val := range map[string]string{"arp_ignore": "1", "arp_announce": "2"} {
				p := filepath.Join("/proc/sys/net/ipv4/conf", dev, key)
				if err := os.WriteFile(p, []byte(val), 0o644); err != nil {
					return fmt.Errorf("vnat: keep local %s: set %s: %w", addr, p, err)
				}
			}
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("vnat: keep local %s: lo: %w", addr, err)
		}
		a := &netlink.Addr{IPNet: netipPrefix(addr), Flags: unix.IFA_F_NOPREFIXROUTE, Scope: unix.RT_SCOPE_HOST}
		if err := netlink.AddrAdd(lo, a); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("vnat: keep local %s on lo: %w", addr, err)
		}
		d.mu.Lock()
		d.kept[addr] = true
		d.mu.Unlock()
		return nil
	})
}

// ReleaseLocal undoes KeepLocal's address (the sysctls stay: they are
// harmless and another kept address may need them).
func (d *Kernel) ReleaseLocal(addr netip.Addr) error {
	return onehopns.DoPath(d.opts.Netns, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("vnat: release %s: lo: %w", addr, err)
		}
		if err := netlink.AddrDel(lo, &netlink.Addr{IPNet: netipPrefix(addr)}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("vnat: release %s from lo: %w", addr, err)
		}
		d.mu.Lock()
		delete(d.kept, addr)
		d.mu.Unlock()
		return nil
	})
}
