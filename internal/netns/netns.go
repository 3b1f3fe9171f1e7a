// Package netns creates, enters and removes named network namespaces (the
// /run/netns/NAME bind mounts iproute2 uses, so `ip netns` sees them too),
// and runs commands in them the way `ip netns exec` does, /sys included.
//
// A Linux network namespace belongs to a thread, not a process. Every switch
// happens on a locked OS thread that is never unlocked, so the Go runtime
// throws it away instead of reusing it in the wrong namespace (the pattern of
// CNI's pkg/ns).
package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Dir is where named namespaces are bind-mounted.
const Dir = "/run/netns"

// Path returns the bind-mount path of the named namespace.
func Path(name string) string { return filepath.Join(Dir, name) }

// Exists reports whether the named namespace exists.
func Exists(name string) bool {
	_, err := os.Stat(Path(name))
	return err == nil
}

// ensureSharedDir makes Dir a shared mount point, as iproute2 does. If Dir
// were a plain directory, a later `ip netns add` would bind-mount Dir onto
// itself and hide every namespace mounted before, so those could no longer be
// deleted by path (and would live on).
func ensureSharedDir() error {
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", Dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) { // EINVAL: not a mount point yet
		return fmt.Errorf("make %s shared: %w", Dir, err)
	}
	if err := unix.Mount(Dir, Dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", Dir, err)
	}
	if err := unix.Mount("", Dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", Dir, err)
	}
	return nil
}

// Create makes a new named namespace with its loopback up.
func Create(name string) error {
	if Exists(name) {
		return fmt.Errorf("network namespace %s already exists", name)
	}
	if err := ensureSharedDir(); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in the new namespace
		h, err := netns.NewNamed(name)
		if err != nil {
			errc <- fmt.Errorf("create network namespace %s: %w", name, err)
			return
		}
		h.Close()
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			errc <- fmt.Errorf("bring up lo in %s: %w", name, err)
			return
		}
		errc <- nil
	}()
	return <-errc
}

// Delete removes the named namespace; its interfaces go with it once no
// process is left inside. A missing namespace is not an error.
func Delete(name string) error {
	if !Exists(name) {
		return nil
	}
	if err := netns.DeleteNamed(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete network namespace %s: %w", name, err)
	}
	return nil
}

// List returns the named namespaces whose names start with prefix.
func List(prefix string) ([]string, error) {
	entries, err := os.ReadDir(Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Handle returns a netlink handle bound to the named namespace; no thread
// switches namespace to use it.
func Handle(name string) (*netlink.Handle, error) {
	ns, err := netns.GetFromPath(Path(name))
	if err != nil {
		return nil, fmt.Errorf("open network namespace %s: %w", name, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", name, err)
	}
	return h, nil
}

// Fd opens the named namespace for moving links into it.
func Fd(name string) (netns.NsHandle, error) {
	ns, err := netns.GetFromPath(Path(name))
	if err != nil {
		return ns, fmt.Errorf("open network namespace %s: %w", name, err)
	}
	return ns, nil
}

// Do runs fn on a thread inside the named namespace, for what has no
// namespace-bound handle (per-namespace sysctls).
func Do(name string, fn func() error) error { return DoPath(Path(name), fn) }

// DoPath is Do for a namespace given by its file (/proc/PID/ns/net, a
// bind mount anywhere). "" is the caller's own namespace: fn runs on the
// calling goroutine (a loader whose interfaces are where it runs).
func DoPath(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread is discarded afterwards
		if err := enter(path); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func enter(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter network namespace %s: %w", path, err)
	}
	return nil
}

// Exec replaces the current process with argv running inside the named
// namespace, as `ip netns exec` runs it: in a mount namespace of its own
// whose /sys describes the network namespace, so tools that read
// /sys/class/net see the node's interfaces, not the machine's. Only returns
// on error.
func Exec(name string, argv []string) error {
	if len(argv) == 0 {
		return errors.New("no command to run")
	}
	// execve from the thread that entered the namespaces: namespaces
	// belong to a thread, and the new program keeps the caller's.
	runtime.LockOSThread()
	if err := enter(Path(name)); err != nil {
		return err
	}
	if err := ownSysfs(name); err != nil {
		return err
	}
	path := argv[0]
	if !strings.Contains(path, "/") {
		p, err := lookPath(path)
		if err != nil {
			return err
		}
		path = p
	}
	if err := syscall.Exec(path, argv, os.Environ()); err != nil {
		return fmt.Errorf("exec %s: %w", argv[0], err)
	}
	return nil
}

// ownSysfs moves the calling thread into a new mount namespace and mounts
// there a sysfs of the network namespace the thread is in, the way iproute2's
// netns_switch does. The thread must be locked and already in that network
// namespace: a sysfs shows the network devices of its mounter's namespace.
func ownSysfs(name string) error {
	// A new mount namespace is per thread here: unshare(CLONE_NEWNS)
	// unshares the thread's fs_struct too, so the other threads of this
	// process keep the machine's /sys.
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("new mount namespace for %s: %w", name, err)
	}
	// Slave, not private: mounts made here never reach the machine, but
	// the machine's still reach here (a lab's bpffs unmounted at lab down
	// is gone for its daemons too).
	if err := unix.Mount("", "/", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make / a slave mount for %s: %w", name, err)
	}
	var flags uintptr
	if err := unix.Unmount("/sys", unix.MNT_DETACH); err != nil {
		// No sysfs there to take away: mount over whatever is; a
		// read-only /sys cannot be shadowed by a writable one.
		var st unix.Statfs_t
		if unix.Statfs("/sys", &st) == nil && st.Flags&unix.ST_RDONLY != 0 {
			flags = unix.MS_RDONLY
		}
	}
	if err := unix.Mount(name, "/sys", "sysfs", flags, ""); err != nil {
		return fmt.Errorf("mount /sys for network namespace %s: %w", name, err)
	}
	return nil
}

func lookPath(file string) (string, error) {
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		p := filepath.Join(dir, file)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: command not found in PATH", file)
}

// WriteSysctl sets a per-namespace sysctl such as net/ipv6/conf/all/disable_ipv6.
func WriteSysctl(name, key, value string) error {
	return Do(name, func() error {
		// /proc/sys/net follows the calling thread's namespace, which Do set.
		p := filepath.Join("/proc/sys", key)
		if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s in %s: %w", key, value, name, err)
		}
		return nil
	})
}
