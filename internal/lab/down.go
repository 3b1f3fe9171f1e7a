package lab

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/netns"
)

// Teardown removes everything a lab made: its daemons, namespaces (and with
// them every veth, bridge and tcx link), the bpffs with its pins, and its
// state directory. It keeps going past errors and reports them all, so a
// second run finishes what the first could not.
func Teardown(st *State, progress io.Writer) error {
	say := func(format string, a ...any) {
		if progress != nil {
			fmt.Fprintf(progress, "  - "+format+"\n", a...)
		}
	}
	var errs []error
	for _, p := range st.Processes {
		if alive(p.PID) {
			say("stopping %s (pid %d)", p.Name, p.PID)
			if err := stop(p.PID); err != nil {
				errs = append(errs, fmt.Errorf("stop %s: %w", p.Name, err))
			}
		}
	}
	// Namespaces recorded in the state, and any with the lab's prefix that a
	// crash kept out of the record.
	seen := map[string]bool{}
	names := append([]string(nil), st.Namespaces...)
	more, _ := netns.List(NamespaceOf(st.Name, ""))
	names = append(names, more...)
	for i := len(names) - 1; i >= 0; i-- {
		n := names[i]
		if seen[n] || !netns.Exists(n) {
			seen[n] = true
			continue
		}
		seen[n] = true
		if err := netns.Delete(n); err != nil {
			errs = append(errs, err)
		}
	}
	if len(seen) > 0 {
		say("removed %d namespaces", len(seen))
	}
	if st.BPFFS != "" {
		unmounted := false
		for i := 0; i < 8; i++ { // a bpffs may have been mounted more than once
			var sfs unix.Statfs_t
			if unix.Statfs(st.BPFFS, &sfs) != nil || sfs.Type != unix.BPF_FS_MAGIC {
				break
			}
			if err := unix.Unmount(st.BPFFS, unix.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", st.BPFFS, err))
				break
			}
			unmounted = true
		}
		if unmounted {
			say("unmounted bpffs %s (pinned maps and links)", st.BPFFS)
		}
	}
	if st.Dir != "" && len(errs) == 0 {
		if err := os.RemoveAll(st.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Down tears down lab name under root. A lab without state but with leftover
// namespaces is cleaned too.
func Down(root, name string, progress io.Writer) error {
	st, err := Load(root, name)
	if err != nil {
		left, _ := netns.List(NamespaceOf(name, ""))
		if len(left) == 0 {
			return err
		}
		st = &State{Name: name}
	}
	return Teardown(st, progress)
}

func alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	// A zombie or a reused pid is not our daemon.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "Z" {
		return false
	}
	// Mid-execve the cmdline reads empty; otherwise it must be ours.
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return len(cmd) == 0 || strings.Contains(string(cmd), "onehop")
}

func stop(pid int) error {
	syscall.Kill(pid, syscall.SIGTERM)
	for i := 0; i < 50; i++ {
		if !alive(pid) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 20; i++ {
		if !alive(pid) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("pid %d still running after SIGKILL", pid)
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log)"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}
