package netns

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// OpenTap makes tap device name (IFF_TAP|IFF_NO_PI: whole Ethernet frames,
// no vnet_hdr) in the namespace at path ("" is the caller's own) and
// returns its file descriptor, as a hypervisor's NIC holds it: the device
// is made down, and closing the descriptor deletes it. nonblock opens it
// O_NONBLOCK, for a reader on Go's poller (os.NewFile).
func OpenTap(path, name string, nonblock bool) (int, error) {
	return OpenTapWith(path, name, TapOptions{Nonblock: nonblock})
}

// Offloads a tap's reader accepts (linux/if_tun.h TUN_F_*), for
// TapOptions.Offloads: the device may then send it frames that still need
// a checksum (TunCsum) or segmenting (TunTSO4, TunTSO6), described by the
// vnet_hdr in front of each.
const (
	TunCsum = 0x01
	TunTSO4 = 0x02
	TunTSO6 = 0x04
)

// TapOptions are how OpenTapWith opens a tap.
type TapOptions struct {
	Nonblock bool
	// VnetHdr puts a struct virtio_net_hdr (10 bytes) in front of every
	// frame read or written, as QEMU's virtio-net backend does: a frame
	// may then be a GSO superpacket or lack its checksum.
	VnetHdr bool
	// Offloads (TunCsum|TunTSO4|...) the reader accepts, set with
	// TUNSETOFFLOAD; only with VnetHdr.
	Offloads int
}

// OpenTapWith is OpenTap with options.
func OpenTapWith(path, name string, o TapOptions) (int, error) {
	if o.Offloads != 0 && !o.VnetHdr {
		return -1, fmt.Errorf("tap %s: offloads need a vnet_hdr", name)
	}
	flags := unix.O_RDWR | unix.O_CLOEXEC
	if o.Nonblock {
		flags |= unix.O_NONBLOCK
	}
	var fd int
	// The device is made in the namespace of whoever opens /dev/net/tun.
	err := DoPath(path, func() error {
		var err error
		fd, err = unix.Open("/dev/net/tun", flags, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(name)
		if err == nil {
			tf := uint16(unix.IFF_TAP | unix.IFF_NO_PI)
			if o.VnetHdr {
				tf |= unix.IFF_VNET_HDR
			}
			ifr.SetUint16(tf)
			err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		}
		if err == nil && o.Offloads != 0 {
			if err = unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, o.Offloads); err != nil {
				err = fmt.Errorf("set offloads %#x: %w", o.Offloads, err)
			}
		}
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("make tap %s: %w", name, err)
		}
		return nil
	})
	return fd, err
}

// OpenMacvtap opens the character device of macvtap ifname in the named
// namespace, as QEMU opens it for `-netdev tap,fd=N` (libvirt passes the fd):
// what is written to it the macvtap sends, what the macvtap receives is
// read from it, each frame after a virtio_net_hdr (IFF_VNET_HDR is on when
// a macvtap is opened). The device is found by the major:minor in the
// namespace's own sysfs (/sys/class/net/IFNAME/tapIFINDEX/dev) and made as
// a node in dir: the machine's /dev/tapN is named by an ifindex, which
// namespaces share. nonblock is as for OpenTap.
func OpenMacvtap(name, ifname, dir string, nonblock bool) (int, error) {
	var dev string
	err := Do(name, func() error {
		if err := ownSysfs(name); err != nil {
			return err
		}
		idx, err := os.ReadFile(filepath.Join("/sys/class/net", ifname, "ifindex"))
		if err != nil {
			return fmt.Errorf("macvtap %s: %w", ifname, err)
		}
		b, err := os.ReadFile(filepath.Join("/sys/class/net", ifname, "tap"+strings.TrimSpace(string(idx)), "dev"))
		if err != nil {
			return fmt.Errorf("macvtap %s: its character device: %w", ifname, err)
		}
		dev = strings.TrimSpace(string(b))
		return nil
	})
	if err != nil {
		return -1, err
	}
	var major, minor uint32
	if _, err := fmt.Sscanf(dev, "%d:%d", &major, &minor); err != nil {
		return -1, fmt.Errorf("macvtap %s: device number %q: %w", ifname, dev, err)
	}
	node := filepath.Join(dir, ifname)
	if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(major, minor))); err != nil {
		return -1, fmt.Errorf("macvtap %s: make %s: %w", ifname, node, err)
	}
	flags := unix.O_RDWR | unix.O_CLOEXEC
	if nonblock {
		flags |= unix.O_NONBLOCK
	}
	fd, err := unix.Open(node, flags, 0)
	if err != nil {
		return -1, fmt.Errorf("open macvtap %s (%s): %w", ifname, dev, err)
	}
	return fd, nil
}
