package netns

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// OpenTap makes tap device name (IFF_TAP|IFF_NO_PI: whole Ethernet frames,
// no vnet_hdr) in the namespace at path ("" is the caller's own) and
// returns its file descriptor, as a hypervisor's NIC holds it: the device
// is made down, and closing the descriptor deletes it. nonblock opens it
// O_NONBLOCK, for a reader on Go's poller (os.NewFile).
func OpenTap(path, name string, nonblock bool) (int, error) {
	flags := unix.O_RDWR | unix.O_CLOEXEC
	if nonblock {
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
			ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
			err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		}
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("make tap %s: %w", name, err)
		}
		return nil
	})
	return fd, err
}
