package lab

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Cgroups: every sliver's processes live in a cgroup v2 of their own,
// HOSTDIR/SLIVER, where HOSTDIR is the directory the host's agent is given
// (--sliver-cgroups): it attaches its socket programs (bind/connect confined
// to the sliver's lease) there once and tells the slivers apart by their
// child cgroup.
//
// The lab mounts cgroup2 under its state directory, as it does the bpffs:
// every lab process runs with /sys remounted for its network namespace
// (netns.Exec), which hides /sys/fs/cgroup, so a path under it would mean
// nothing to the agent. Each mount of cgroup2 shows the same hierarchy; the
// lab's part of it is onehop-LAB at its root.

// cgroupMount is where lab st mounts cgroup2.
func cgroupMount(st *State) string { return filepath.Join(st.Dir, "cgroup") }

// labCgroup is the lab's own part of the hierarchy, under its mount.
func labCgroup(st *State) string { return filepath.Join(cgroupMount(st), "onehop-"+st.Name) }

// HostCgroupDir is the directory host's agent takes its slivers' cgroups
// from (--sliver-cgroups).
func HostCgroupDir(st *State, host string) string { return filepath.Join(labCgroup(st), host) }

// SliverCgroupDir is sliver's cgroup on host.
func SliverCgroupDir(st *State, host, sliver string) string {
	return filepath.Join(HostCgroupDir(st, host), sliver)
}

// ensureCgroup mounts the lab's cgroup2 (once) and makes dir, a directory
// under labCgroup, with its parents.
func ensureCgroup(st *State, dir string) error {
	mnt := cgroupMount(st)
	if st.CgroupFS == "" {
		st.CgroupFS = mnt
		// Recorded before the mount, so a teardown finds it whatever
		// happens next.
		if err := st.save(); err != nil {
			return err
		}
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(mnt, &sfs); err != nil || sfs.Type != unix.CGROUP2_SUPER_MAGIC {
		if err := os.MkdirAll(mnt, 0o700); err != nil {
			return err
		}
		if err := unix.Mount("cgroup2", mnt, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("mount cgroup2 at %s (slivers need cgroup v2): %w", mnt, err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("make cgroup %s: %w", dir, err)
	}
	return nil
}

// JoinCgroup moves the calling process (every thread of it) into the cgroup
// dir, so that what it execs next runs there.
func JoinCgroup(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte("0"), 0); err != nil {
		return fmt.Errorf("join cgroup %s: %w", dir, err)
	}
	return nil
}

// JoinSliver moves the calling process into the cgroup of node, a sliver of
// lab st; `lab exec SLIVER` does it before exec, so everything run in a
// sliver is under its host's confinement of it. A node that is no sliver
// is left alone.
func JoinSliver(st *State, node string) error {
	for _, s := range st.Slivers {
		if s.Name == node {
			dir := SliverCgroupDir(st, s.Host, s.Name)
			if err := ensureCgroup(st, dir); err != nil {
				return err
			}
			return JoinCgroup(dir)
		}
	}
	return nil
}

// removeCgroup kills every process in dir and its children (cgroup.kill)
// and removes them all, deepest first. A missing dir is not an error.
func removeCgroup(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() {
			errs = append(errs, removeCgroup(filepath.Join(dir, e.Name())))
		}
	}
	if err := killCgroup(dir); err != nil {
		errs = append(errs, err)
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
	}
	return errors.Join(errs...)
}

// killCgroup kills what runs in dir and waits (up to 5 s) for it to be
// gone: a cgroup with processes cannot be removed.
func killCgroup(dir string) error {
	if populated(dir) == 0 {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
		return fmt.Errorf("kill processes of cgroup %s: %w", dir, err)
	}
	for i := 0; i < 100; i++ {
		if populated(dir) == 0 {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("cgroup %s still has processes 5 s after cgroup.kill", dir)
}

// populated reads cgroup.events' populated: 1 while a process is in dir or
// below, 0 once none is, -1 when it cannot be read (treated as empty: a
// cgroup that is gone has no processes).
func populated(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		return -1
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var k string
		var v int
		if n, _ := fmt.Sscan(sc.Text(), &k, &v); n == 2 && k == "populated" {
			return v
		}
	}
	return -1
}

// cgroupPIDs lists the processes directly in dir.
func cgroupPIDs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range bytes.Fields(b) {
		n, err := strconv.Atoi(string(f))
		if err != nil {
			return nil, fmt.Errorf("cgroup.procs of %s: %q", dir, f)
		}
		out = append(out, n)
	}
	return out, nil
}

// removeCgroups removes the lab's whole cgroup tree (killing what still
// runs in it) and unmounts its cgroup2, at lab down.
func removeCgroups(st *State, say func(string, ...any)) error {
	if st.CgroupFS == "" {
		return nil
	}
	var errs []error
	var sfs unix.Statfs_t
	if unix.Statfs(st.CgroupFS, &sfs) == nil && sfs.Type == unix.CGROUP2_SUPER_MAGIC {
		dir := filepath.Join(st.CgroupFS, "onehop-"+st.Name)
		if err := removeCgroup(dir); err != nil {
			errs = append(errs, err)
		} else {
			say("removed cgroups %s", dir)
		}
		if err := unix.Unmount(st.CgroupFS, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", st.CgroupFS, err))
		}
	}
	return errors.Join(errs...)
}
