// Package e2e proves onehop's features end to end: real labs of network
// namespaces, real traffic from ordinary tools (ping, iperf3, tcpdump,
// tshark), assertions on what arrived and what was counted as dropped.
//
// A test here must be able to fail:
//   - it needs root and tools through internal/testenv (upLab asks for the
//     common ones), so under CI=true nothing skips;
//   - "nothing arrived" is read from a watch (watchVM, watchFabric) proven
//     live before and after by proveLive and stopWatches;
//   - a counter is read with metricSet.at, rise or dropDelta: one the agent
//     does not export fails the test instead of reading as zero;
//   - it waits for a condition (waitFor, eventually, waitListening), never
//     for a time, unless the time is what it measures (and says so);
//   - every lab it brings up is down when it ends: TestMain fails the run
//     on a lab left behind.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/testenv"
)

var binary string

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Println("e2e: not root; namespace tests skipped")
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "onehop-e2e-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "onehop")
	build := exec.Command("go", "build", "-o", binary, "../../cmd/onehop")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Println("e2e: build onehop:", err)
		os.Exit(1)
	}
	// One e2e run at a time on a machine: a second run would take the first
	// one's labs for leftovers and tear them down.
	if err := os.MkdirAll(testRoot, 0o700); err != nil {
		fmt.Println("e2e:", err)
		os.Exit(1)
	}
	lock, err := os.OpenFile(filepath.Join(testRoot, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX)
	}
	if err != nil {
		fmt.Println("e2e: lock", testRoot, err)
		os.Exit(1)
	}
	if err := removeStaleLabs("a killed run left"); err != nil {
		fmt.Println("e2e:", err)
		os.Exit(1)
	}
	code := m.Run()
	// Every test takes its lab down; one still here leaked.
	if left := lab.Names(testRoot); len(left) > 0 {
		fmt.Printf("e2e: FAIL: labs left behind by the tests: %v\n", left)
		code = 1
	}
	if err := removeStaleLabs("the tests left"); err != nil {
		fmt.Println("e2e:", err)
		code = 1
	}
	if err := lock.Close(); err != nil {
		fmt.Println("e2e: unlock:", err)
		code = 1
	}
	if err := os.RemoveAll(dir); err != nil {
		fmt.Println("e2e:", err)
		code = 1
	}
	os.Exit(code)
}

const testRoot = "/run/onehop-e2e"

// removeStaleLabs tears down labs left behind (by whom: why).
func removeStaleLabs(why string) error {
	for _, name := range lab.Names(testRoot) {
		fmt.Printf("e2e: removing lab %s, which %s\n", name, why)
		if err := lab.Down(testRoot, name, nil); err != nil {
			return fmt.Errorf("remove lab %s: %w", name, err)
		}
	}
	return nil
}

// testLab is a lab brought up for one test and torn down after it, pass or fail.
type testLab struct {
	t      *testing.T
	name   string
	status *lab.Report
}

func needRoot(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t, "creates network namespaces and loads BPF")
}

const quickstart = `name: %s
hosts:
  - name: h1
  - name: h2
farms:
  - name: blue
    subnets:
      - name: web
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
  - {name: web3, host: h1, subnet: blue/web}
`

// labTools are what every lab test runs: in the nodes (ping, python3 for
// crafted packets, curl for metrics, ss), to capture (tcpdump, tshark), and
// iproute2. A test that needs more asks for it itself.
var labTools = []string{"ip", "ping", "python3", "curl", "ss", "tcpdump", "tshark"}

func upLab(t *testing.T, topo string) *testLab {
	t.Helper()
	needRoot(t)
	testenv.RequireTool(t, labTools...)
	name := fmt.Sprintf("e2e%d", rand.Intn(1_000_000))
	path := filepath.Join(t.TempDir(), "topo.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(topo, name)), 0o600); err != nil {
		t.Fatal(err)
	}
	l := &testLab{t: t, name: name}
	t.Cleanup(func() {
		out, err := exec.Command(binary, "lab", "down", "--root", testRoot, "--lab", name).CombinedOutput()
		if err != nil {
			t.Errorf("lab down: %v\n%s", err, out)
		}
	})
	l.onehop("lab", "up", path)
	l.refresh()
	return l
}

// onehop runs a lab subcommand against this lab and returns its output.
func (l *testLab) onehop(args ...string) string {
	l.t.Helper()
	args = append(args, "--root", testRoot, "--lab", l.name)
	out, err := exec.Command(binary, args...).CombinedOutput()
	if err != nil {
		l.t.Fatalf("onehop %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// in runs a command inside a lab node and returns its output. No command
// may hang the suite: each is killed after a minute.
func (l *testLab) in(node string, cmd ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := append([]string{"lab", "exec", "--root", testRoot, "--lab", l.name, node, "--"}, cmd...)
	out, err := exec.CommandContext(ctx, binary, args...).CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s on %s: killed after a minute: %w", strings.Join(cmd, " "), node, ctx.Err())
	}
	return string(out), err
}

func (l *testLab) mustIn(node string, cmd ...string) string {
	l.t.Helper()
	out, err := l.in(node, cmd...)
	if err != nil {
		l.t.Fatalf("%s: %s: %v\n%s", node, strings.Join(cmd, " "), err, out)
	}
	return out
}

// background is a command running inside a lab node.
type background struct {
	cmd  *exec.Cmd
	out  testenv.Buffer
	done chan struct{}
}

// Output returns what the command has printed so far.
func (b *background) Output() string { return b.out.String() }

// Stop interrupts the command (SIGINT, then SIGKILL) and returns its output.
func (b *background) Stop() string {
	select {
	case <-b.done:
	default:
		// An error means it has just exited: done is about to close.
		if err := b.cmd.Process.Signal(syscall.SIGINT); err != nil && !errors.Is(err, os.ErrProcessDone) {
			b.kill()
		}
		select {
		case <-b.done:
		case <-time.After(5 * time.Second):
			b.kill()
		}
	}
	return b.Output()
}

// kill ends the command for good and waits for it.
func (b *background) kill() {
	if err := b.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		// Waiting would hang the suite; say so loudly instead.
		fmt.Fprintf(os.Stderr, "e2e: cannot kill %v (pid %d): %v\n", b.cmd.Args, b.cmd.Process.Pid, err)
		return
	}
	<-b.done
}

// start runs a command inside a node in the background; it is stopped when
// the test ends if not before.
func (l *testLab) start(node string, cmd ...string) *background {
	l.t.Helper()
	args := append([]string{"lab", "exec", "--root", testRoot, "--lab", l.name, node, "--"}, cmd...)
	return l.background(exec.Command(binary, args...))
}

// background starts cmd; it is stopped when the test ends if not before.
func (l *testLab) background(cmd *exec.Cmd) *background {
	l.t.Helper()
	b := &background{cmd: cmd, done: make(chan struct{})}
	b.cmd.Stdout, b.cmd.Stderr = &b.out, &b.out
	if err := b.cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	// How it ended shows in its output; Stop only needs to know it did.
	go func() { _ = b.cmd.Wait(); close(b.done) }()
	l.t.Cleanup(func() { b.Stop() })
	return b
}

func (l *testLab) refresh() {
	l.t.Helper()
	var r lab.Report
	if err := json.Unmarshal([]byte(l.onehop("lab", "status", "-o", "json")), &r); err != nil {
		l.t.Fatalf("lab status -o json: %v", err)
	}
	l.status = &r
}

func (l *testLab) node(name string) lab.NodeReport {
	l.t.Helper()
	for _, n := range l.status.Nodes {
		if n.Name == name {
			return n
		}
	}
	l.t.Fatalf("lab has no node %s", name)
	return lab.NodeReport{}
}

func (l *testLab) mac(node, ifname string) string {
	l.t.Helper()
	for _, i := range l.node(node).Interfaces {
		if i.Name == ifname {
			return i.MAC
		}
	}
	l.t.Fatalf("node %s has no interface %s", node, ifname)
	return ""
}

func (l *testLab) ip(vm string) string {
	l.t.Helper()
	n := l.node(vm)
	if n.VM == nil {
		l.t.Fatalf("%s is not a VM", vm)
	}
	return n.VM.IP
}

// metricSet is one reading of an agent's /metrics: "name{labels}" (the node
// label left out) -> value. A counter a test reads must exist: at fails the
// test on an absent one, which would otherwise read as zero and make "it
// did not rise" pass vacuously.
type metricSet struct {
	t    *testing.T
	host string
	m    map[string]float64
}

// at is the value of key, which must exist.
func (s metricSet) at(key string) float64 {
	s.t.Helper()
	v, ok := s.m[key]
	if !ok {
		s.t.Fatalf("%s's agent exports no metric %s (absent is not zero); of its family it has %v", s.host, key, s.family(key))
	}
	return v
}

// lookup is the value of key and whether it exists.
func (s metricSet) lookup(key string) (float64, bool) {
	v, ok := s.m[key]
	return v, ok
}

// family lists the exported metrics with key's name, whatever their labels.
func (s metricSet) family(key string) []string {
	name, _, _ := strings.Cut(key, "{")
	var out []string
	for k := range s.m {
		if n, _, _ := strings.Cut(k, "{"); n == name {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// rise is how much a metric grew from before to after; both must have it.
func rise(before, after metricSet, key string) float64 {
	before.t.Helper()
	return after.at(key) - before.at(key)
}

// metrics reads an agent's /metrics. Every line must parse, and the
// datapath's counter families must be there.
func (l *testLab) metrics(host string) metricSet {
	l.t.Helper()
	out := l.mustIn(host, "curl", "-sf", fmt.Sprintf("http://127.0.0.1:%d/metrics", lab.MetricsPort))
	m := metricSet{t: l.t, host: host, m: map[string]float64{}}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			l.t.Fatalf("%s /metrics: line %q has no value", host, line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			l.t.Fatalf("%s /metrics: line %q: %v", host, line, err)
		}
		key := line[:i]
		key = strings.Replace(key, fmt.Sprintf(`node="%s",`, host), "", 1)
		key = strings.Replace(key, fmt.Sprintf(`,node="%s"`, host), "", 1)
		key = strings.Replace(key, fmt.Sprintf(`{node="%s"}`, host), "", 1)
		m.m[key] = v
	}
	if err := sc.Err(); err != nil {
		l.t.Fatalf("%s /metrics: %v", host, err)
	}
	for _, family := range []string{"onehop_dropped_packets_total", "onehop_forwarded_packets_total"} {
		if len(m.family(family)) == 0 {
			l.t.Fatalf("%s /metrics has no %s counters: the datapath's counters could not be read\n%s", host, family, out)
		}
	}
	return m
}

func drops(reason string) string {
	return fmt.Sprintf(`onehop_dropped_packets_total{reason="%s"}`, reason)
}
func forwards(path string) string {
	return fmt.Sprintf(`onehop_forwarded_packets_total{path="%s"}`, path)
}

// ping sends count echo requests (with extra ping options) and says whether
// every one was answered.
func (l *testLab) ping(from, to string, count int, extra ...string) error {
	args := append([]string{"ping", "-c", strconv.Itoa(count), "-i", "0.2", "-W", "1"}, extra...)
	out, err := l.in(from, append(args, to)...)
	if err != nil {
		return fmt.Errorf("ping %s -> %s: %v\n%s", from, to, err, out)
	}
	if !strings.Contains(out, fmt.Sprintf("%d received", count)) {
		return fmt.Errorf("ping %s -> %s lost packets:\n%s", from, to, out)
	}
	return nil
}

// waitListening waits until a server in vm listens on proto ("tcp" or
// "udp") port.
func (l *testLab) waitListening(vm, proto string, port int) {
	l.t.Helper()
	flag := map[string]string{"tcp": "-Hltn", "udp": "-Hlun"}[proto]
	testenv.Eventually(l.t, fmt.Sprintf("a %s server on %s:%d", proto, vm, port), 5*time.Second, func() error {
		out, err := l.in(vm, "ss", flag, fmt.Sprintf("sport = :%d", port))
		if err != nil {
			return fmt.Errorf("ss: %v: %s", err, out)
		}
		if !strings.Contains(out, fmt.Sprintf(":%d", port)) {
			return fmt.Errorf("ss shows no listener: %q", out)
		}
		return nil
	})
}
