package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/testenv"
	"github.com/onehop/onehop/internal/topology"
)

func TestPrivilegedAgentRestartKeepsTrafficFlowingAndMaps(t *testing.T) {
	l := upLab(t, quickstart)
	web2 := l.ip("web2")
	if err := l.ping("web1", web2, 2); err != nil {
		t.Fatal(err)
	}
	before := l.metrics("h1")
	agent := l.node("h1").Process
	if agent == nil || !agent.Alive {
		t.Fatalf("h1 has no running agent: %+v", agent)
	}

	// A steady ping across hosts while h1's agent is killed outright.
	pinger := l.start("web1", "ping", "-i", "0.05", "-W", "1", web2)
	testenv.Eventually(t, "web1's steady ping to be answered", 5*time.Second, func() bool { return pingReplies(pinger.Output()) >= 3 })
	if err := syscall.Kill(agent.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "h1's agent to be gone", 5*time.Second, func() error { return processGone(agent.PID) })
	// No agent at all on h1: the pinned datapath must carry on by itself.
	// Measured in answered pings (30 at 50 ms: 1.5 s), not in time.
	atKill := pingReplies(pinger.Output())
	testenv.Eventually(t, "30 more ping replies with no agent on h1", 10*time.Second, func() bool {
		return pingReplies(pinger.Output()) >= atKill+30
	})
	if err := l.ping("web3", web2, 3); err != nil {
		t.Errorf("with h1's agent dead, a new flow from h1 failed: %v", err)
	}
	l.onehop("lab", "restart", "h1")
	l.refresh()
	newPID := l.node("h1").Process.PID
	testenv.Eventually(t, "restarted agent to serve metrics", 10*time.Second, func() bool {
		_, err := l.in("h1", "curl", "-sf", "http://127.0.0.1:9100/metrics")
		return err == nil
	})
	// And through the new agent's own reconcile.
	atRestart := pingReplies(pinger.Output())
	testenv.Eventually(t, "10 more ping replies after the restart", 5*time.Second, func() bool {
		return pingReplies(pinger.Output()) >= atRestart+10
	})
	out := pinger.Stop()

	sent, recv := pingCounts(t, out)
	if sent < 30 || recv != sent {
		t.Errorf("ping across the agent restart: %d sent, %d received; want no loss\n%s", sent, recv, out)
	}
	after := l.metrics("h1")
	// The counters live in the pinned maps: a new agent that reused them
	// continues from where the old one was; fresh maps would start at zero.
	if after.at(forwards("to_fabric")) < before.at(forwards("to_fabric"))+float64(sent) {
		t.Errorf("to_fabric counter %v -> %v after %d pings: maps were not reused across the restart",
			before.at(forwards("to_fabric")), after.at(forwards("to_fabric")), sent)
	}
	if newPID == agent.PID {
		t.Errorf("agent pid unchanged (%d): restart did not happen", newPID)
	}
	log, err := os.ReadFile(l.node("h1").Process.Log)
	if err != nil {
		t.Fatalf("restarted agent's log: %v", err)
	}
	if !strings.Contains(string(log), "datapath reconciled") {
		t.Errorf("restarted agent never reconciled; log:\n%s", log)
	}
}

// pingReplies counts the answers a running ping has printed.
func pingReplies(out string) int { return strings.Count(out, " bytes from ") }

// processGone says whether pid has exited (a zombie has).
func processGone(pid int) error {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, rest, ok := strings.Cut(string(stat), ") "); ok && strings.HasPrefix(rest, "Z") {
		return nil
	}
	return fmt.Errorf("pid %d still runs: %s", pid, stat)
}

func pingCounts(t *testing.T, out string) (sent, recv int) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "packets transmitted") {
			f := strings.Fields(line)
			var err1, err2 error
			if len(f) > 3 {
				sent, err1 = strconv.Atoi(f[0])
				recv, err2 = strconv.Atoi(f[3])
			}
			if len(f) <= 3 || err1 != nil || err2 != nil {
				t.Fatalf("ping summary %q: %v %v", line, err1, err2)
			}
			return
		}
	}
	t.Fatalf("no ping summary in:\n%s", out)
	return
}

// writeTopo writes a topology for lab name into the test's directory.
func writeTopo(t *testing.T, file, topo, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), file)
	if err := os.WriteFile(path, []byte(fmt.Sprintf(topo, name)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestPrivilegedSecondUpOfRunningLabSaysSo(t *testing.T) {
	l := upLab(t, quickstart)
	path := writeTopo(t, "again.yaml", quickstart, l.name)
	out, err := exec.Command(binary, "lab", "up", path, "--root", testRoot).CombinedOutput()
	if err == nil {
		t.Fatalf("second lab up succeeded:\n%s", out)
	}
	if !strings.Contains(string(out), "already up") {
		t.Errorf("second lab up error does not say the lab is already up:\n%s", out)
	}
	// And the first lab is untouched.
	if err := l.ping("web1", l.ip("web2"), 2); err != nil {
		t.Errorf("first lab broken by the second up: %v", err)
	}
}

func TestPrivilegedBadTopologyIsRejectedBeforeAnythingIsCreated(t *testing.T) {
	needRoot(t)
	name := "e2ebad"
	path := writeTopo(t, "bad.yaml", strings.Replace(quickstart, "host: h2", "host: h9", 1), name)
	out, err := exec.Command(binary, "lab", "up", path, "--root", testRoot).CombinedOutput()
	if err == nil {
		t.Fatalf("lab up accepted a VM on an unknown host:\n%s", out)
	}
	if !strings.Contains(string(out), "bad.yaml:11:") || !strings.Contains(string(out), `host "h9" is not defined`) {
		t.Errorf("error does not name the line and reason:\n%s", out)
	}
	if left, err := netns.List(lab.NamespaceOf(name, "")); err != nil || len(left) > 0 {
		t.Errorf("rejected topology still created namespaces %v (%v)", left, err)
	}
	if _, err := os.Stat(filepath.Join(testRoot, name)); err == nil {
		t.Errorf("rejected topology left a state dir")
	}
}

// assertNothingLeft checks the machine holds nothing of lab name.
func assertNothingLeft(t *testing.T, name string, pids []int, bpffs string) {
	t.Helper()
	if left, err := netns.List(lab.NamespaceOf(name, "")); err != nil || len(left) > 0 {
		t.Errorf("namespaces left behind: %v (%v)", left, err)
	}
	for _, pid := range pids {
		if err := processGone(pid); err != nil {
			t.Errorf("daemon left behind: %v", err)
		}
	}
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	if bpffs != "" && strings.Contains(string(mounts), bpffs) {
		t.Errorf("bpffs %s still mounted", bpffs)
	}
	if _, err := os.Stat(filepath.Join(testRoot, name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state dir %s left behind", filepath.Join(testRoot, name))
	}
	links, err := exec.Command("ip", "-o", "link").Output()
	if err != nil {
		t.Fatalf("ip -o link: %v", err)
	}
	for _, ln := range strings.Split(string(links), "\n") {
		if strings.Contains(ln, "vif-") || strings.Contains(ln, "uplink0") || strings.Contains(ln, "p-h1") {
			t.Errorf("link left in the root namespace: %s", ln)
		}
	}
}

func TestPrivilegedLabDownLeavesNothingBehind(t *testing.T) {
	needRoot(t)
	name := "e2edown"
	path := writeTopo(t, "topo.yaml", quickstart, name)
	out, err := exec.Command(binary, "lab", "up", path, "--root", testRoot).CombinedOutput()
	if err != nil {
		t.Fatalf("lab up: %v\n%s", err, out)
	}
	st, err := lab.Load(testRoot, name)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, p := range st.Processes {
		pids = append(pids, p.PID)
	}
	if len(pids) != 3 {
		t.Fatalf("expected controller and two agents, state has %+v", st.Processes)
	}
	out, err = exec.Command(binary, "lab", "down", "--root", testRoot, "--lab", name).CombinedOutput()
	if err != nil {
		t.Fatalf("lab down: %v\n%s", err, out)
	}
	assertNothingLeft(t, name, pids, st.BPFFS)
	// A second down says there is nothing to remove, and fails.
	if out, err := exec.Command(binary, "lab", "down", "--root", testRoot, "--lab", name).CombinedOutput(); err == nil {
		t.Errorf("second lab down succeeded silently:\n%s", out)
	}
}

func TestPrivilegedFailedUpRemovesWhatItBuilt(t *testing.T) {
	needRoot(t)
	topo, err := topology.Parse("fail.yaml", []byte(fmt.Sprintf(quickstart, "e2efail")))
	if err != nil {
		t.Fatal(err)
	}
	// A daemon that cannot start makes up fail halfway, after the fabric,
	// the controller namespace and the bpffs exist.
	_, err = lab.Up(t.Context(), topo, lab.Options{Root: testRoot, Binary: "/bin/false", Timeout: 3 * time.Second})
	if err == nil {
		t.Fatal("lab up with a broken daemon binary succeeded")
	}
	t.Logf("up failed as it should: %v", err)
	assertNothingLeft(t, "e2efail", nil, filepath.Join(testRoot, "e2efail", "bpffs"))
}

func TestPrivilegedLabDownWorksWhenIproute2SharesTheNamespaceDir(t *testing.T) {
	needRoot(t)
	name := "e2eiproute"
	path := writeTopo(t, "topo.yaml", quickstart, name)
	if out, err := exec.Command(binary, "lab", "up", path, "--root", testRoot).CombinedOutput(); err != nil {
		t.Fatalf("lab up: %v\n%s", err, out)
	}
	// iproute2 makes /run/netns a shared mount point if it is not one; had
	// the lab not done so first, this would hide the lab's namespaces.
	if out, err := exec.Command("ip", "netns", "add", "ohe2e-iproute").CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	if out, err := exec.Command("ip", "netns", "del", "ohe2e-iproute").CombinedOutput(); err != nil {
		t.Errorf("ip netns del: %v\n%s", err, out)
	}
	st, err := lab.Load(testRoot, name)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(binary, "lab", "down", "--root", testRoot, "--lab", name).CombinedOutput(); err != nil {
		t.Fatalf("lab down after iproute2 touched /run/netns: %v\n%s", err, out)
	}
	assertNothingLeft(t, name, nil, st.BPFFS)
}
