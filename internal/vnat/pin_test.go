package vnat

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/netns"
)

// bpffs mounts a bpffs of the test's own (this machine's /sys/fs/bpf may
// not be one) and returns a pin directory on it.
func bpffs(t *testing.T) string {
	t.Helper()
	mnt := t.TempDir()
	if err := unix.Mount("bpf", mnt, "bpf", 0, ""); err != nil {
		t.Fatalf("mount bpffs at %s: %v", mnt, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Error(err)
		}
	})
	return filepath.Join(mnt, "onehop", "vnat", "netns-test")
}

// tcxPrograms counts the programs on ifname's tcx hook at (in n).
func tcxPrograms(t *testing.T, n *testNS, ifname string, at ebpf.AttachType) int {
	t.Helper()
	l, err := n.h.LinkByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	var k int
	err = netns.Do(n.name, func() error {
		r, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: at})
		if err != nil {
			return err
		}
		k = len(r.Programs)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Pinned, the translation outlives the Kernel that made it: after Close
// the programs stay on the interface and the maps keep the translation; a
// new Kernel on the same pin directory takes the migrated connection
// over (and translates with it), clears the helper marks, and replaces the
// programs on the hook rather than adding some. Remove then takes it all
// away. Unpinned (the control), Close leaves nothing.
func TestPrivilegedPinnedTranslationsOutliveTheDatapath(t *testing.T) {
	n := newTestNS(t)
	pin := bpffs(t)
	v := Virtual{Proto: TCP, Local: vA, Remote: vB}
	p := Physical{Proto: TCP, Local: pA, Remote: pB}

	d1, err := Open(Options{Netns: n.path, PinDir: pin})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	if err := d1.AttachInterface("vn0"); err != nil {
		t.Fatal(err)
	}
	if err := d1.Translate(v, p); err != nil {
		t.Fatal(err)
	}
	if err := d1.StartKeepalive(v); err != nil {
		t.Fatal(err)
	}
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		if k := tcxPrograms(t, n, "vn0", at); k != 1 {
			t.Fatalf("%s of vn0 holds %d programs after a pinned Close, want 1", at, k)
		}
	}

	d2, err := Open(Options{Netns: n.path, PinDir: pin})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	if ms := d2.Migrations(); len(ms) != 1 || ms[0].Virtual != v || ms[0].Physical != p {
		t.Fatalf("the new datapath took over %+v, want [%v -> %v]", ms, v, p)
	}
	if _, ok, err := d2.KeepaliveAnswered(v); err != nil || ok {
		t.Errorf("helper mark of the old run still there (%v, %v): a new daemon must start its own", ok, err)
	}
	if err := d2.AttachInterface("vn0"); err != nil {
		t.Fatal(err)
	}
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		if k := tcxPrograms(t, n, "vn0", at); k != 1 {
			t.Fatalf("%s of vn0 holds %d programs after a second run attached, want 1 (replaced)", at, k)
		}
	}
	egress, _, _ := d2.Programs()
	in := pkt{proto: TCP, src: vA, dst: vB, payload: "after restart"}.build(t)
	want := pkt{proto: TCP, src: pA, dst: pB, payload: "after restart"}.build(t)
	if ret, got := run(t, egress, in); ret != tcxNext || !bytes.Equal(got, want) {
		t.Errorf("egress of the second run: %#x\n got %x\nwant %x", ret, got, want)
	}
	if err := d2.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		if k := tcxPrograms(t, n, "vn0", at); k != 0 {
			t.Errorf("%s of vn0 holds %d programs after Remove, want 0", at, k)
		}
	}
	if _, err := os.Stat(pin); !os.IsNotExist(err) {
		t.Errorf("pin dir %s after Remove: %v, want it gone", pin, err)
	}

	// Unpinned: Close detaches.
	d3, err := Open(Options{Netns: n.path})
	if err != nil {
		t.Fatal(err)
	}
	if err := d3.AttachInterface("vn0"); err != nil {
		t.Fatal(err)
	}
	if err := d3.Close(); err != nil {
		t.Fatal(err)
	}
	if k := tcxPrograms(t, n, "vn0", ebpf.AttachTCXEgress); k != 0 {
		t.Errorf("egress of vn0 holds %d programs after an unpinned Close, want 0", k)
	}
	if _, err := Open(Options{Netns: n.path, PinDir: t.TempDir()}); err == nil {
		t.Error("a pin dir on no bpffs was accepted")
	}
}
