package lab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// leftoversBridge is a bridge lab (plumbing only): h1 is .10, inet .11.
const leftoversBridge = `name: %s
datapath: bridge
fabric: {cidr: 192.168.79.0/24}
hosts: [{name: h1}]
externals: [{name: inet}]
`

// iperf3Daemon starts `iperf3 -s -D` on port in namespace ns through the
// command prefix (`onehop lab exec NODE --`, `ip netns exec NS`) and returns
// its pid, read from its pid file; the test kills it at the end if it is
// still there.
func iperf3Daemon(t *testing.T, prefix []string, port int) int {
	t.Helper()
	pidfile := filepath.Join(t.TempDir(), "iperf3.pid")
	argv := append(slices.Clone(prefix), "iperf3", "-s", "-D", "-p", strconv.Itoa(port), "-I", pidfile)
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	var pid int
	testenv.Eventually(t, "iperf3's pid file "+pidfile, 5*time.Second, func() error {
		b, err := os.ReadFile(pidfile)
		if err == nil {
			pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		return err
	})
	t.Cleanup(func() {
		// Only if that pid is still an iperf3: it may be gone and reused.
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "iperf3" {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return pid
}

// iperf3Reaches runs a short iperf3 client in namespace ns against addr:port.
func iperf3Reaches(ns, addr string, port int) error {
	out, err := exec.Command("ip", "netns", "exec", ns, "iperf3", "-c", addr, "-p", strconv.Itoa(port), "-n", "64K").CombinedOutput()
	if err != nil {
		return fmt.Errorf("iperf3 from %s to %s:%d: %w\n%s", ns, addr, port, err, out)
	}
	return nil
}

// running says whether pid is a process that has not exited (a zombie has).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

func TestPrivilegedLabDownEndsWhatRunsInItsNodesAndNothingElse(t *testing.T) {
	testenv.RequireTool(t, "ip", "iperf3")
	st, _ := upBridgeLab(t, leftoversBridge)
	root, bin := filepath.Dir(st.Dir), onehopBinary(t)
	h1, inet := NamespaceOf(st.Name, "h1"), NamespaceOf(st.Name, "inet")
	other := netnstest.New(t, "ohdown")

	// Daemons started in the lab's nodes the two ways an operator would,
	// and one in a namespace of the test's own, outside the lab.
	inH1 := iperf3Daemon(t, []string{bin, "lab", "exec", "--root", root, "--lab", st.Name, "h1", "--"}, 5301)
	inInet := iperf3Daemon(t, []string{"ip", "netns", "exec", inet}, 5302)
	outside := iperf3Daemon(t, []string{"ip", "netns", "exec", other}, 5303)
	// And one that ignores SIGTERM (SIG_IGN survives the exec into sleep).
	stubborn := netnstest.Start(t, "sleep ignoring SIGTERM in h1", &testenv.Buffer{},
		exec.Command(bin, "lab", "exec", "--root", root, "--lab", st.Name, "h1", "--", "sh", "-c", `trap "" TERM; exec sleep 600`)).Cmd
	testenv.Eventually(t, "sleep ignoring SIGTERM to run in h1", 5*time.Second, func() error {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", stubborn.Process.Pid))
		if strings.TrimSpace(string(comm)) != "sleep" {
			return fmt.Errorf("pid %d is %q", stubborn.Process.Pid, comm)
		}
		return nil
	})

	// Control: each runs in its namespace and answers.
	found, err := netns.Processes([]string{h1, inet, other})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(found[h1], stubborn.Process.Pid) {
		t.Fatalf("sleep (pid %d) is not among the processes of %s: %v", stubborn.Process.Pid, h1, found[h1])
	}
	for ns, pid := range map[string]int{h1: inH1, inet: inInet, other: outside} {
		if !slices.Contains(found[ns], pid) {
			t.Fatalf("iperf3 (pid %d) is not among the processes of %s: %v", pid, ns, found[ns])
		}
	}
	for _, c := range []struct {
		from, to string
		port     int
	}{{inet, "192.168.79.10", 5301}, {h1, "192.168.79.11", 5302}, {other, "127.0.0.1", 5303}} {
		if err := iperf3Reaches(c.from, c.to, c.port); err != nil {
			t.Fatalf("before lab down: %v", err)
		}
	}

	out, err := exec.Command(bin, "lab", "down", "--root", root, "--lab", st.Name).CombinedOutput()
	if err != nil {
		t.Fatalf("lab down: %v\n%s", err, out)
	}
	t.Logf("lab down:\n%s", out)
	// lab down waits for what it ends: gone when it returns, and said.
	for node, pid := range map[string]int{"h1": inH1, "inet": inInet} {
		if running(pid) {
			t.Errorf("iperf3 (pid %d) started in %s outlived lab down:\n%s", pid, node, out)
		}
		if want := fmt.Sprintf("iperf3 (pid %d), left running in node %s", pid, node); !strings.Contains(string(out), want) {
			t.Errorf("lab down does not report %q:\n%s", want, out)
		}
	}
	if running(stubborn.Process.Pid) {
		t.Errorf("sleep ignoring SIGTERM (pid %d) in h1 outlived lab down:\n%s", stubborn.Process.Pid, out)
	}
	if want := fmt.Sprintf("killed sleep (pid %d), left running in node h1 (SIGKILL", stubborn.Process.Pid); !strings.Contains(string(out), want) {
		t.Errorf("lab down does not report %q:\n%s", want, out)
	}
	for _, ns := range []string{h1, inet} {
		if netns.Exists(ns) {
			t.Errorf("namespace %s is still there", ns)
		}
	}
	// The daemon outside the lab runs on and answers.
	if !running(outside) {
		t.Fatalf("iperf3 (pid %d) in %s, outside the lab, was ended by lab down:\n%s", outside, other, out)
	}
	if err := iperf3Reaches(other, "127.0.0.1", 5303); err != nil {
		t.Errorf("after lab down: %v", err)
	}
	if strings.Contains(string(out), fmt.Sprintf("pid %d)", outside)) {
		t.Errorf("lab down reports the process outside the lab:\n%s", out)
	}
}
