package lab

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/onehop/onehop/internal/netns"
)

// Teardown removes everything a lab made: its daemons, namespaces (and with
// them every veth, bridge and tcx link), what its kinds made besides (the
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
