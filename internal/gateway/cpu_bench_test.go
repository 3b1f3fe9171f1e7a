package gateway

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cpuMeter reads the CPU time a benchmark's transfers cost, two ways:
//   - ours: the test process (user, server, NAT's and xTR's softirq work
//     done in their context) and the gateway daemon, from a cpuacct cgroup
//     they run in, plus the ksoftirqd threads (softirq work deferred there;
//     this kernel has no IRQ time accounting, so softirq time is charged to
//     whichever task was running it);
//   - all: every CPU's busy time from /proc/stat (includes other work on
//     the machine: an upper bound).
type cpuMeter struct {
	dir      string
	softirqd []string
}

// newCPUMeter moves the test process into a fresh cpuacct cgroup (v1); its
// children (the gateway daemon) inherit it. Cleanup moves it back.
func newCPUMeter(t testing.TB) *cpuMeter {
	t.Helper()
	const root = "/sys/fs/cgroup/cpuacct"
	sfx := make([]byte, 3)
	if _, err := rand.Read(sfx); err != nil {
		t.Fatal(err)
	}
	m := &cpuMeter{dir: filepath.Join(root, "gwperf-"+hex.EncodeToString(sfx))}
	if err := os.Mkdir(m.dir, 0o755); err != nil {
		t.Fatalf("cpu meter: %v", err)
	}
	if err := os.WriteFile(filepath.Join(m.dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatalf("cpu meter: join cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(filepath.Join(root, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			t.Errorf("cpu meter: leave cgroup: %v", err)
			return
		}
		if err := os.Remove(m.dir); err != nil {
			t.Errorf("cpu meter: %v", err)
		}
	})
	comms, err := filepath.Glob("/proc/[0-9]*/comm")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range comms {
		if b, err := os.ReadFile(c); err == nil && strings.HasPrefix(string(b), "ksoftirqd/") {
			m.softirqd = append(m.softirqd, filepath.Join(filepath.Dir(c), "stat"))
		}
	}
	if len(m.softirqd) == 0 {
		t.Fatal("cpu meter: no ksoftirqd thread found")
	}
	return m
}

// cpuSample is the meter's reading: seconds of CPU.
type cpuSample struct{ ours, all float64 }

func (m *cpuMeter) read(t testing.TB) cpuSample {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(m.dir, "cpuacct.usage"))
	if err != nil {
		t.Fatal(err)
	}
	ns, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("cpuacct.usage: %v", err)
	}
	s := cpuSample{ours: float64(ns) / 1e9}
	const hz = 100 // USER_HZ: /proc's clock ticks
	for _, p := range m.softirqd {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		// fields after "(comm)": state is 3rd, utime 14th, stime 15th
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		u, err1 := strconv.ParseUint(f[11], 10, 64)
		st, err2 := strconv.ParseUint(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: %v %v", p, err1, err2)
		}
		s.ours += float64(u+st) / hz
	}
	b, err = os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line := strings.SplitN(string(b), "\n", 2)[0]
	f := strings.Fields(line)
	if f[0] != "cpu" || len(f) < 8 {
		t.Fatalf("/proc/stat: %q", line)
	}
	for i, v := range f[1:8] { // user nice system idle iowait irq softirq
		if i == 3 || i == 4 {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("/proc/stat: %v", err)
		}
		s.all += float64(n) / hz
	}
	return s
}

// perGiB is CPU seconds per GiB moved between two readings.
func perGiB(a, b cpuSample, bytes int64) cpuSample {
	g := float64(bytes) / (1 << 30)
	return cpuSample{ours: (b.ours - a.ours) / g, all: (b.all - a.all) / g}
}

func fmtSpread(v []float64, prec int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.FormatFloat(x, 'f', prec, 64)
	}
	return fmt.Sprintf("%s (%s)", strconv.FormatFloat(median(v), 'f', prec, 64), strings.Join(s, " "))
}

// perfRecord, with GWBENCH_PERF=DIR set, records every CPU (perf record
// -a -g) until the returned func is called, into DIR/VARIANT-ROUND.data,
// and the thread ids of the meter's cgroup into DIR/VARIANT-ROUND.tids (so
// a report can keep our threads, ksoftirqd and idle's softirqs, and leave
// the rest of the machine out); without it, it does nothing. For finding where a variant's time goes
// (perf's own cost makes those rounds' figures worthless).
func (m *cpuMeter) perfRecord(t testing.TB, variant string, round int) func() {
	t.Helper()
	dir := os.Getenv("GWBENCH_PERF")
	if dir == "" {
		return func() {}
	}
	name := strings.NewReplacer(" ", "_", ",", "", "(", "", ")", "").Replace(variant)
	base := filepath.Join(dir, fmt.Sprintf("%s-%d", name, round))
	cmd := exec.Command("perf", "record", "-a", "-g", "-q", "-o", base+".data")
	if err := cmd.Start(); err != nil {
		t.Fatalf("perf: %v", err)
	}
	time.Sleep(300 * time.Millisecond) // perf opens its events on every CPU
	return func() {
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatalf("perf: %v", err)
		}
		tids, err := os.ReadFile(filepath.Join(m.dir, "tasks"))
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Logf("perf: %v", err) // interrupted: its exit status says so
		}
		if err := os.WriteFile(base+".tids", tids, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
