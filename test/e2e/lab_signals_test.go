package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/testenv"
)

// labProcesses lists the pids of processes that belong to lab name: every
// daemon of a lab carries the lab's state directory in its arguments.
func labProcesses(t *testing.T, name string) []int {
	t.Helper()
	dir := filepath.Join(testRoot, name) + "/"
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue // gone meanwhile
		}
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if strings.Contains(string(cmd), dir) && !strings.Contains(string(stat), ") Z ") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// assertLabGone checks that nothing of lab name is left: no namespace, no
// daemon, no bpffs mount, no state (see assertNothingLeft), and no process
// at all whose arguments name the lab's state directory.
func assertLabGone(t *testing.T, name string) {
	t.Helper()
	assertNothingLeft(t, name, labProcesses(t, name), filepath.Join(testRoot, name, "bpffs"))
	if pids := labProcesses(t, name); len(pids) > 0 {
		t.Errorf("processes of lab %s still running: %v", name, pids)
	}
}

// downAfter removes lab name when the test ends, whatever happened, so a
// failing test leaves nothing for the next one.
func downAfter(t *testing.T, name string) {
	t.Cleanup(func() {
		_, stateErr := os.Stat(filepath.Join(testRoot, name))
		left, err := netns.List(lab.NamespaceOf(name, ""))
		if err != nil {
			t.Errorf("list namespaces: %v", err)
		}
		if stateErr != nil && len(left) == 0 {
			return // nothing to remove
		}
		if err := lab.Down(testRoot, name, nil); err != nil {
			t.Errorf("removing what lab %s left: %v", name, err)
		}
	})
}

func writeTopology(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "topo.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(quickstart, name)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPrivilegedLabUpIntoHeadEndsUpOrLeavesNothing pipes lab up's progress
// into `head -3`, which stops reading after three lines. A lab up killed by
// the SIGPIPE of its next line left namespaces, a bpffs mount and a running
// controller behind. Either the lab is fully up (and lab down removes all of
// it) or nothing is left.
func TestPrivilegedLabUpIntoHeadEndsUpOrLeavesNothing(t *testing.T) {
	testenv.RequireRoot(t, "builds a lab of namespaces")
	testenv.RequireTool(t, "sh", "head")
	name := "e2ehead"
	downAfter(t, name)
	path := writeTopology(t, name)
	cmd := exec.Command("sh", "-c", fmt.Sprintf("%q lab up %q --root %q 2>&1 | head -3", binary, path, testRoot))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the pipeline failed: %v\n%s", err, out)
	}
	if n := strings.Count(string(out), "\n"); n != 3 {
		t.Fatalf("head printed %d lines, want 3 (so lab up wrote into a closed pipe):\n%s", n, out)
	}
	// sh waited for lab up too: it has finished, one way or the other.
	st, err := lab.Load(testRoot, name)
	if err != nil {
		t.Logf("lab up did not finish the lab (%v); nothing may be left", err)
		assertLabGone(t, name)
		return
	}
	if st.Phase != "up" {
		t.Errorf("lab %s left in phase %q: lab up died halfway", name, st.Phase)
	}
	r := lab.Status(t.Context(), st)
	for _, n := range r.Nodes {
		if !n.Present || (n.Process != nil && !n.Process.Alive) {
			t.Errorf("node %s of a lab that is up: present %v, process %+v", n.Name, n.Present, n.Process)
		}
	}
	if down, err := exec.Command(binary, "lab", "down", "--root", testRoot, "--lab", name).CombinedOutput(); err != nil {
		t.Fatalf("lab down: %v\n%s", err, down)
	}
	assertLabGone(t, name)
}

// TestPrivilegedInterruptedLabUpLeavesNothing stops lab up with SIGTERM (or
// SIGINT, as Ctrl-C does) at several points of the build: once its daemons
// run, and while it waits for the agents. Nothing of the lab may be left: no
// namespace, no mount, no process.
func TestPrivilegedInterruptedLabUpLeavesNothing(t *testing.T) {
	testenv.RequireRoot(t, "builds a lab of namespaces")
	cases := []struct {
		sig   syscall.Signal
		after string // the progress line lab up is stopped at
	}{
		{syscall.SIGTERM, "  - agent on h1"},
		{syscall.SIGINT, "  - controller "},
		{syscall.SIGTERM, "  - vm blue/web/web2"},
	}
	for i, c := range cases {
		t.Run(fmt.Sprintf("%s after %q", c.sig, strings.TrimSpace(c.after)), func(t *testing.T) {
			name := fmt.Sprintf("e2esig%d", i)
			downAfter(t, name)
			cmd := exec.Command(binary, "lab", "up", writeTopology(t, name), "--root", testRoot)
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var seen []string
			lines := bufio.NewScanner(stderr)
			for lines.Scan() {
				seen = append(seen, lines.Text())
				if strings.HasPrefix(lines.Text(), c.after) {
					break
				}
			}
			if !strings.HasPrefix(seen[len(seen)-1], c.after) {
				cmd.Wait()
				t.Fatalf("lab up never printed %q:\n%s", c.after, strings.Join(seen, "\n"))
			}
			// Something to leave behind exists by now.
			if left, _ := netns.List(lab.NamespaceOf(name, "")); len(left) == 0 {
				t.Fatalf("no namespace of %s exists at %q: the signal would prove nothing", name, c.after)
			}
			if err := cmd.Process.Signal(c.sig); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				for lines.Scan() {
					seen = append(seen, lines.Text())
				}
				done <- cmd.Wait()
			}()
			select {
			case err = <-done:
			case <-time.After(60 * time.Second):
				cmd.Process.Kill()
				t.Fatalf("lab up still running a minute after %s:\n%s", c.sig, strings.Join(seen, "\n"))
			}
			if err == nil {
				t.Errorf("lab up stopped by %s exited 0", c.sig)
			}
			t.Logf("lab up after %s: %v; it said:\n%s", c.sig, err, strings.Join(seen, "\n"))
			assertLabGone(t, name)
		})
	}
}
