package netns

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Processes returns, for each named namespace in names, the processes that
// run in it: those whose /proc/PID/ns/net is that namespace (the same nsfs
// inode as its bind mount). Only a process's main thread is asked, so a
// program with one thread switched into a namespace for a moment (Do) is not
// counted. /proc is read once, however many names; a name that does not exist
// is left out, and so is a process that ends while it is read.
func Processes(names []string) (map[string][]int, error) {
	type inode struct{ dev, ino uint64 }
	want := map[inode]string{}
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Stat(Path(n), &st); err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return nil, fmt.Errorf("network namespace %s: %w", n, err)
		}
		want[inode{st.Dev, st.Ino}] = n
	}
	out := map[string][]int{}
	if len(want) == 0 {
		return out, nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		// Stat follows the ns link to the namespace's nsfs inode; a
		// kernel thread or a process gone meanwhile fails, and is none.
		if unix.Stat("/proc/"+e.Name()+"/ns/net", &st) != nil {
			continue
		}
		if n, ok := want[inode{st.Dev, st.Ino}]; ok {
			out[n] = append(out[n], pid)
		}
	}
	return out, nil
}
