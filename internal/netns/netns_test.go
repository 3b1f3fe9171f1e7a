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
	// Other packages' tests run beside this one and add links and
	// namespaces (mounts under /run/netns) of their own: what must not
	// change is the sysfs the machine sees, so only that is compared.
	if len(after) < 2 {
		t.Errorf("the machine's /sys/class/net lists %d entries after exec (%d before): the namespace's sysfs leaked", len(after), len(hostSys))
	}
	mountsAfter, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if b, a := sysMounts(string(mountsBefore)), sysMounts(string(mountsAfter)); b != a {
		t.Errorf("exec changed the machine's mounts under /sys:\nbefore:\n%s\nafter:\n%s", b, a)
	}
}

// sysMounts is the lines of a mountinfo table whose mount point is /sys or
// below it (the fifth field).
func sysMounts(mountinfo string) string {
	var out []string
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == "/sys" || strings.HasPrefix(f[4], "/sys/")) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
