package lab

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/netns"
)

// Teardown removes everything a lab made: its daemons, whatever else runs in
// its namespaces, the namespaces (and with them every veth, bridge and tcx link), what its kinds made besides (the
// bpffs with its pins), and its state directory. It keeps going past errors
// and reports them all, so a second run finishes what the first could not.
func Teardown(st *State, w io.Writer) error {
	out := &progress{w: w}
	say := func(format string, a ...any) { out.printf("  - "+format+"\n", a...) }
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
	// What else runs in them: a namespace lives on, name gone, while a
	// process is inside, and so does all it serves.
	if err := endLeftovers(st.Name, names, say); err != nil {
		errs = append(errs, err)
	}
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
	// What kinds made outside namespaces and processes (the agents' bpffs).
	for _, k := range kinds {
		if r, ok := k.(remover); ok {
			if err := r.remove(st, say); err != nil {
				errs = append(errs, err)
			}
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
// namespaces is cleaned too. Like Up, it outlives a closed stdout or stderr.
func Down(root, name string, progress io.Writer) error {
	survivePipes()
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

// The grace a leftover process has to end after SIGTERM, and after SIGKILL.
const (
	termGrace = 3 * time.Second
	killGrace = 2 * time.Second
)

// leftover is a process found running in a lab's namespace.
type leftover struct {
	pidfd, pid int
	comm, node string
}

// endLeftovers ends every process still running in one of the namespaces of
// lab once its own daemons are stopped: what an operator started in a node
// (`onehop lab exec h1 -- iperf3 -s -D`, `ip netns exec`) would otherwise
// outlive the lab in a namespace whose name is gone. SIGTERM first, SIGKILL
// what is left after termGrace; each one ended is reported. This process and
// its ancestors are spared (a `lab down` run from inside a node), and no
// process outside the namespaces is touched.
func endLeftovers(lab string, namespaces []string, say func(string, ...any)) error {
	found, err := netns.Processes(namespaces)
	if err != nil || len(found) == 0 {
		return err
	}
	spare := ancestors()
	var ls []leftover
	for ns, pids := range found {
		for _, pid := range pids {
			if spare[pid] {
				continue
			}
			// Signals go through a pidfd: they reach this process
			// and no other that might take its pid later.
			fd, err := unix.PidfdOpen(pid, 0)
			if err != nil {
				continue // ended meanwhile
			}
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			ls = append(ls, leftover{pidfd: fd, pid: pid, comm: strings.TrimSpace(string(comm)), node: nodeOf(lab, ns)})
		}
	}
	slices.SortFunc(ls, func(a, b leftover) int {
		return cmp.Or(strings.Compare(a.node, b.node), a.pid-b.pid)
	})
	defer func() {
		for _, l := range ls {
			unix.Close(l.pidfd)
		}
	}()
	// A pid read before its pidfd was opened may have been taken by a
	// process elsewhere since: keep only those still in a lab namespace.
	again, err := netns.Processes(namespaces)
	if err != nil {
		return err
	}
	still := map[int]bool{}
	for _, pids := range again {
		for _, pid := range pids {
			still[pid] = true
		}
	}
	var mine []leftover
	for _, l := range ls {
		if still[l.pid] {
			mine = append(mine, l)
		}
	}
	signalAll(mine, unix.SIGTERM)
	left := waitExit(mine, termGrace)
	signalAll(left, unix.SIGKILL)
	survivors := waitExit(left, killGrace)
	killed := map[int]bool{}
	for _, l := range left {
		killed[l.pid] = true
	}
	var errs []error
	for _, l := range mine {
		switch {
		case slices.ContainsFunc(survivors, func(s leftover) bool { return s.pid == l.pid }):
			errs = append(errs, fmt.Errorf("%s (pid %d) in node %s still runs after SIGKILL", l.comm, l.pid, l.node))
		case killed[l.pid]:
			say("killed %s (pid %d), left running in node %s (SIGKILL: SIGTERM did not end it in %v)", l.comm, l.pid, l.node, termGrace)
		default:
			say("ended %s (pid %d), left running in node %s", l.comm, l.pid, l.node)
		}
	}
	return errors.Join(errs...)
}

func signalAll(ls []leftover, sig unix.Signal) {
	for _, l := range ls {
		// ESRCH: it ended by itself; nothing else can fail for root.
		unix.PidfdSendSignal(l.pidfd, sig, nil, 0)
	}
}

// waitExit waits up to d for the processes of ls to end (a pidfd polls
// readable once its process has exited) and returns those that have not.
func waitExit(ls []leftover, d time.Duration) []leftover {
	deadline := time.Now().Add(d)
	for len(ls) > 0 {
		ms := time.Until(deadline).Milliseconds()
		if ms <= 0 {
			break
		}
		fds := make([]unix.PollFd, len(ls))
		for i, l := range ls {
			fds[i] = unix.PollFd{Fd: int32(l.pidfd), Events: unix.POLLIN}
		}
		n, err := unix.Poll(fds, int(ms))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			break
		}
		var rest []leftover
		for i, l := range ls {
			if fds[i].Revents == 0 {
				rest = append(rest, l)
			}
		}
		ls = rest
	}
	return ls
}

// ancestors are this process and its parents up to init.
func ancestors() map[int]bool {
	out := map[int]bool{}
	for pid := os.Getpid(); pid > 1 && !out[pid]; {
		out[pid] = true
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			break
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) < 2 {
			break
		}
		pid, _ = strconv.Atoi(f[1])
	}
	return out
}
