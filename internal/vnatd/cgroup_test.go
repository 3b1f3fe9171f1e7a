package vnatd

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/testenv"
	"github.com/onehop/onehop/internal/vcmp"
)

// testCgroup makes a cgroup v2 directory with a sleeping process in it,
// on a cgroup2 mount of its own outside /sys (a daemon started through
// `onehop netns-exec` has /sys remounted for its namespace, which hides
// /sys/fs/cgroup; every mount of cgroup2 shows the same hierarchy).
func testCgroup(t *testing.T) (dir string, pid int) {
	t.Helper()
	testenv.RequireRoot(t, "cgroups")
	mnt := filepath.Join(t.TempDir(), "cgroup")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("cgroup2", mnt, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		testenv.Missing(t, "mount cgroup2 at %s: %v", mnt, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Error(err)
		}
	})
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	dir = filepath.Join(mnt, "vnat-helpers-"+hex.EncodeToString(b))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("0"), 0o644) //nolint:errcheck // thawed so it can die
		if err := cmd.Process.Kill(); err != nil {
			t.Error(err)
		}
		cmd.Wait() //nolint:errcheck // killed
		// rmdir fails while the cgroup still holds the dying process.
		testenv.Eventually(t, "the cgroup removed", 5*time.Second, func() error { return os.Remove(dir) })
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, cmd.Process.Pid
}

// frozen reads the cgroup's frozen state from cgroup.events.
func frozen(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "frozen "); ok {
			return v == "1"
		}
	}
	t.Fatalf("no frozen line in %s/cgroup.events: %q", dir, b)
	return false
}

func waitFrozen(t *testing.T, dir string, want bool) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("cgroup %s frozen %v", dir, want), 5*time.Second, func() bool { return frozen(t, dir) == want })
}

// The freezer helper freezes a real cgroup (with a process in it) for the
// first connection whose peer is away and thaws it after the last.
func TestPrivilegedCgroupFreezerFreezesAndThawsARealCgroup(t *testing.T) {
	dir, pid := testCgroup(t)
	f, err := CgroupFreezer(dir)
	if err != nil {
		t.Fatal(err)
	}
	if frozen(t, dir) {
		t.Fatal("frozen before the helper started")
	}
	c1 := vcmp.Tuple{Proto: vcmp.TCP, Local: ap("10.0.2.2:22"), Remote: ap("10.0.1.1:40000")}
	c2 := vcmp.Tuple{Proto: vcmp.TCP, Local: ap("10.0.2.2:22"), Remote: ap("10.0.1.1:40001")}
	if err := f.Start(c1); err != nil {
		t.Fatal(err)
	}
	if err := f.Start(c2); err != nil {
		t.Fatal(err)
	}
	waitFrozen(t, dir, true)
	if err := f.Stop(c1); err != nil {
		t.Fatal(err)
	}
	if !frozen(t, dir) {
		t.Fatal("thawed while another connection's peer is still away")
	}
	if err := f.Stop(c2); err != nil {
		t.Fatal(err)
	}
	waitFrozen(t, dir, false)
	if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err != nil {
		t.Errorf("the application is gone after the thaw: %v", err)
	}
}

// --freeze-cgroup refuses what it cannot or must not freeze, naming it.
func TestPrivilegedFreezeCgroupIsValidated(t *testing.T) {
	dir, _ := testCgroup(t)
	mnt := filepath.Dir(dir)
	// A /proc of a daemon that runs inside dir.
	proc := t.TempDir()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "mountinfo"), mi, 0o644); err != nil {
		t.Fatal(err)
	}
	rel, err := cgroupRel(dir, "/proc/self")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "cgroup"), []byte("0::"+rel+"/daemon\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path, proc, want string
	}{
		{"", "/proc/self", "empty path"},
		{t.TempDir(), "/proc/self", "not a cgroup v2 directory"},
		{filepath.Join(dir, "nope"), "/proc/self", "no such file"},
		{mnt, "/proc/self", "root cgroup cannot be frozen"},
		{dir, proc, "the vnat daemon itself is in it"},
	} {
		_, err := checkFreezable(c.path, c.proc)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "--freeze-cgroup") {
			t.Errorf("checkFreezable(%q): %v; want an error about %q naming --freeze-cgroup", c.path, err, c.want)
		}
	}
	if got, err := checkFreezable(dir, "/proc/self"); err != nil || got != dir {
		t.Errorf("checkFreezable(%q) = %q, %v; want it accepted", dir, got, err)
	}
}
