package netns

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/testenv"
)

// execHelperEnv makes the test binary act as `Exec(ns, argv)`: Exec replaces
// the process, so it is tested in a child.
const execHelperEnv = "ONEHOP_NETNS_EXEC_HELPER"

func TestMain(m *testing.M) {
	if ns := os.Getenv(execHelperEnv); ns != "" {
		err := Exec(ns, os.Args[1:])
		fmt.Fprintln(os.Stderr, "exec:", err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

func TestPrivilegedExecShowsTheNamespaceItsOwnSys(t *testing.T) {
	testenv.RequireRoot(t, "creates a network namespace and mounts sysfs")
	name := fmt.Sprintf("oh-test-sys%d", os.Getpid())
	if err := Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Delete(name); err != nil {
			t.Error(err)
		}
	})
	hostSys, err := os.ReadDir("/sys/class/net")
	if err != nil {
		t.Fatal(err)
	}
	mountsBefore, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}

	run := func(argv ...string) string {
		t.Helper()
		cmd := exec.Command(os.Args[0], argv...)
		cmd.Env = append(os.Environ(), execHelperEnv+"="+name)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("exec in %s: %s: %v\n%s", name, strings.Join(argv, " "), err, out)
		}
		return string(out)
	}
	// A fresh namespace has only lo; the machine has more (this test
	// proves nothing on a machine with only lo).
	if len(hostSys) < 2 {
		t.Fatalf("the machine's /sys/class/net holds only %v; cannot tell it from a namespace's", hostSys)
	}
	if got := run("ls", "/sys/class/net"); got != "lo\n" {
		t.Errorf("in %s, /sys/class/net lists %q; want only lo (the machine has %d interfaces)", name, got, len(hostSys))
	}

	// The machine's /sys and mount table are untouched.
	after, err := os.ReadDir("/sys/class/net")
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(hostSys) {
		t.Errorf("the machine's /sys/class/net changed: %d entries, then %d", len(hostSys), len(after))
	}
	mountsAfter, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if string(mountsAfter) != string(mountsBefore) {
		t.Errorf("exec changed the machine's mounts:\nbefore:\n%s\nafter:\n%s", mountsBefore, mountsAfter)
	}
}
