package vnatd

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// CgroupFreezer is the generic helper over a cgroup v2 directory
// (`onehop vnat run --freeze-cgroup PATH`): it writes PATH/cgroup.freeze.
// PATH must be a non-root cgroup v2 directory that does not hold the
// daemon itself (freezing it would freeze the daemon that thaws it).
func CgroupFreezer(path string) (*Freezer, error) {
	dir, err := checkFreezable(path, "/proc/self")
	if err != nil {
		return nil, err
	}
	file := filepath.Join(dir, "cgroup.freeze")
	return &Freezer{Set: func(frozen bool) error {
		v := "0"
		if frozen {
			v = "1"
		}
		if err := os.WriteFile(file, []byte(v), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", file, err)
		}
		return nil
	}}, nil
}

// checkFreezable says why path cannot be frozen for the process whose
// /proc directory is proc, or returns it cleaned and absolute.
func checkFreezable(path, proc string) (string, error) {
	if path == "" {
		return "", errors.New("--freeze-cgroup: empty path")
	}
	dir, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("--freeze-cgroup %s: %w", path, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "", fmt.Errorf("--freeze-cgroup %s: %w", path, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return "", fmt.Errorf("--freeze-cgroup %s: not a cgroup v2 directory (the cgroup2 hierarchy is mounted at %s)", path, orNone(cgroup2Mount(proc)))
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.freeze")); err != nil {
		return "", fmt.Errorf("--freeze-cgroup %s: no cgroup.freeze (the root cgroup cannot be frozen; name the application's own cgroup): %w", path, err)
	}
	rel, err := cgroupRel(dir, proc)
	if err != nil {
		return "", fmt.Errorf("--freeze-cgroup %s: %w", path, err)
	}
	own, err := ownCgroup(proc)
	if err != nil {
		return "", fmt.Errorf("--freeze-cgroup %s: %w", path, err)
	}
	if own == rel || strings.HasPrefix(own, strings.TrimSuffix(rel, "/")+"/") {
		return "", fmt.Errorf("--freeze-cgroup %s: the vnat daemon itself is in it (cgroup %s): freezing it would freeze the daemon that thaws it; run the application in a cgroup of its own", path, own)
	}
	return dir, nil
}

func orNone(s string) string {
	if s == "" {
		return "nowhere"
	}
	return s
}

// mount is one cgroup2 mount: where it is, and which cgroup is its root.
type mount struct{ point, root string }

// cgroup2Mounts lists the cgroup2 mounts the process proc sees.
func cgroup2Mounts(proc string) []mount {
	f, err := os.Open(filepath.Join(proc, "mountinfo"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []mount
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent maj:min root point opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fs := strings.Fields(pre)
		if !ok || len(fs) < 5 || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		out = append(out, mount{point: fs[4], root: fs[3]})
	}
	return out
}

func cgroup2Mount(proc string) string {
	if ms := cgroup2Mounts(proc); len(ms) > 0 {
		return ms[0].point
	}
	return ""
}

// cgroupRel is dir's cgroup path ("/a/b"), through the cgroup2 mount it is under.
func cgroupRel(dir, proc string) (string, error) {
	best := mount{}
	for _, m := range cgroup2Mounts(proc) {
		if (dir == m.point || strings.HasPrefix(dir, strings.TrimSuffix(m.point, "/")+"/")) && len(m.point) > len(best.point) {
			best = m
		}
	}
	if best.point == "" {
		return "", errors.New("under no cgroup2 mount")
	}
	rel := filepath.Join("/", best.root, strings.TrimPrefix(dir, best.point))
	return rel, nil
}

// ownCgroup is the process's cgroup v2 path ("0::/x" in /proc/PID/cgroup).
func ownCgroup(proc string) (string, error) {
	b, err := os.ReadFile(filepath.Join(proc, "cgroup"))
	if err != nil {
		return "", fmt.Errorf("this process's cgroup: %w", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("this process has no cgroup v2 path")
}
