package e2e

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/testenv"
)

// guestMarker starts every line the guest's /init prints for the test to
// read on the serial console, so kernel messages never pass for one.
const guestMarker = "onehop-guest: "

// guestModules are the modules a virtio-net NIC needs, loaded in this
// order's dependency order (modules.dep adds what each one needs).
var guestModules = []string{"virtio_pci", "virtio_net"}

// guestKernel is a Debian kernel image for QEMU's -kernel and the release
// its modules are installed under.
type guestKernel struct {
	image, release string
}

// findGuestKernel picks the newest /boot/vmlinuz-R whose modules
// (/lib/modules/R/modules.dep) are installed: Debian's linux-image-amd64,
// not the kernel the machine runs (a container's has no image here).
func findGuestKernel(t *testing.T) guestKernel {
	t.Helper()
	images, _ := filepath.Glob("/boot/vmlinuz-*")
	slices.Sort(images)
	for i := len(images) - 1; i >= 0; i-- {
		rel := strings.TrimPrefix(filepath.Base(images[i]), "vmlinuz-")
		if _, err := os.Stat(filepath.Join("/lib/modules", rel, "modules.dep")); err != nil {
			continue
		}
		f, err := os.Open(images[i])
		if err != nil {
			testenv.Missing(t, "guest kernel %s is not readable: %v", images[i], err)
		}
		f.Close()
		return guestKernel{image: images[i], release: rel}
	}
	testenv.Missing(t, "needs a kernel image /boot/vmlinuz-R with its modules in /lib/modules/R for the QEMU guest (make deps installs linux-image-amd64); found %v", images)
	return guestKernel{}
}

// moduleOrder lists the module files (relative to /lib/modules/R) that
// names need, each after the modules it depends on, read from
// modules.dep.
func (k guestKernel) moduleOrder(names ...string) ([]string, error) {
	dir := filepath.Join("/lib/modules", k.release)
	f, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("guest kernel modules: %w", err)
	}
	defer f.Close()
	deps := map[string][]string{} // module file -> the files it needs
	byName := map[string]string{} // module name -> its file
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		mod, need, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		deps[mod] = strings.Fields(need)
		byName[moduleName(mod)] = mod
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s/modules.dep: %w", dir, err)
	}
	var order []string
	seen := map[string]bool{}
	var visit func(mod string)
	visit = func(mod string) {
		if seen[mod] {
			return
		}
		seen[mod] = true
		for _, d := range deps[mod] {
			visit(d)
		}
		order = append(order, mod)
	}
	for _, n := range names {
		mod, ok := byName[n]
		if !ok {
			return nil, fmt.Errorf("guest kernel %s has no module %s in %s/modules.dep", k.release, n, dir)
		}
		visit(mod)
	}
	for _, mod := range order {
		// busybox insmod loads plain .ko files only.
		if !strings.HasSuffix(mod, ".ko") {
			return nil, fmt.Errorf("guest kernel module %s is compressed: the guest's busybox insmod needs a plain .ko", mod)
		}
	}
	return order, nil
}

// moduleName is a module file's module name (kernel/net/core/failover.ko
// is failover).
func moduleName(file string) string {
	base := filepath.Base(file)
	base, _, _ = strings.Cut(base, ".ko")
	return strings.ReplaceAll(base, "-", "_")
}

// staticBusybox is the path of a statically linked busybox (Debian's
// busybox-static): the initramfs has no libc to load a dynamic one.
func staticBusybox(t *testing.T) string {
	t.Helper()
	const path = "/bin/busybox"
	f, err := elf.Open(path)
	if err != nil {
		testenv.Missing(t, "needs a static %s for the QEMU guest (make deps installs busybox-static): %v", path, err)
		return ""
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			testenv.Missing(t, "%s is dynamically linked; the QEMU guest needs busybox-static (make deps installs it)", path)
		}
	}
	return path
}

// guestDHCPScript is udhcpc's script in the guest: it configures what the
// lease gave and prints it. The address on eth0 comes from here only.
const guestDHCPScript = `#!/bin/sh
case "$1" in
bound|renew)
	ip addr flush dev "$interface"
	ip addr add "$ip/$mask" dev "$interface"
	[ -n "$router" ] && ip route add default via "${router%% *}" dev "$interface"
	echo "` + guestMarker + `lease ip=$ip mask=$mask router=$router serverid=$serverid"
	;;
esac
`

// guestInit is the guest's /init before the test's part: busybox applets,
// the virtio-net modules, eth0 up. Then the test's part runs, and the
// guest powers off (QEMU with -no-reboot exits), whatever it did.
const guestInit = `#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /sbin /usr/bin /usr/sbin /tmp
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo "` + guestMarker + `init"
for m in %s; do
	insmod "/lib/modules/$m" || echo "` + guestMarker + `insmod $m failed"
done
ip link set lo up
ip link set eth0 up || echo "` + guestMarker + `no eth0"
%s
echo "` + guestMarker + `done"
poweroff -f
`

// buildInitramfs packs a newc cpio for the guest: a static busybox, the
// virtio-net modules of kernel k, udhcpc's script at /bin/onehop-dhcp and
// an /init that brings eth0 up and then runs body (shell).
func buildInitramfs(t *testing.T, k guestKernel, body string) string {
	t.Helper()
	testenv.RequireTool(t, "cpio")
	busybox := staticBusybox(t)
	mods, err := k.moduleOrder(guestModules...)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "root")
	write := func(rel string, data []byte, mode os.FileMode) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
	}
	copyIn := func(rel, from string) {
		t.Helper()
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatalf("initramfs: %v", err)
		}
		write(rel, b, 0o755)
	}
	copyIn("bin/busybox", busybox)
	var insmod []string
	for _, m := range mods {
		copyIn(filepath.Join("lib/modules", filepath.Base(m)), filepath.Join("/lib/modules", k.release, m))
		insmod = append(insmod, filepath.Base(m))
	}
	write("bin/onehop-dhcp", []byte(guestDHCPScript), 0o755)
	write("init", []byte(fmt.Sprintf(guestInit, strings.Join(insmod, " "), body)), 0o755)

	var files bytes.Buffer
	err = filepath.WalkDir(root, func(p string, _ os.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fmt.Fprintln(&files, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "initramfs.cpio")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stderr bytes.Buffer
	cmd := exec.Command("cpio", "-o", "-H", "newc", "--quiet")
	cmd.Dir, cmd.Stdin, cmd.Stdout, cmd.Stderr = root, &files, f, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("cpio the guest's initramfs: %v\n%s", err, stderr.String())
	}
	return out
}

// qemuArgs is the QEMU command line of a guest booted from k and initrd,
// whose virtio-net NIC with mac is on tap ifname. QEMU creates the tap in
// the namespace it runs in and, with script=no, leaves it down: the agent
// brings it up once its program is attached. TCG: the machine has no KVM.
func qemuArgs(k guestKernel, initrd, ifname, mac string) []string {
	return []string{"qemu-system-x86_64",
		"-accel", "tcg", "-m", "256", "-smp", "1",
		"-nographic", "-no-reboot",
		"-kernel", k.image, "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 quiet",
		"-netdev", "tap,id=n0,ifname=" + ifname + ",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac=" + mac,
	}
}

// guestLines are the complete marked lines of a guest's console output,
// marker removed. The last line counts only once its newline has arrived:
// the serial console delivers a line in pieces, and a reader that took
// "reply to hello from qemu" for the whole of "...qemu1" failed CI once.
func guestLines(console string) []string {
	var out []string
	lines := strings.Split(console, "\n")
	for _, line := range lines[:len(lines)-1] {
		if _, rest, ok := strings.Cut(strings.TrimRight(line, "\r"), guestMarker); ok {
			out = append(out, rest)
		}
	}
	return out
}

func TestGuestLinesHoldBackALineUntilItsNewlineArrives(t *testing.T) {
	partial := "boot\r\n" + guestMarker + "init\r\n" + guestMarker + "tcp reply=reply to hello from qemu"
	if got := guestLines(partial); !slices.Equal(got, []string{"init"}) {
		t.Fatalf("guestLines(%q) = %q, want only the whole line", partial, got)
	}
	if got := guestLines(partial + "1\r\n"); !slices.Equal(got, []string{"init", "tcp reply=reply to hello from qemu1"}) {
		t.Fatalf("guestLines with the line finished = %q", got)
	}
}
