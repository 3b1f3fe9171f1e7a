package main

import (
	"math"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
)

const procStat = `cpu  128426 7 35959 1085706 1432 11 2325 78 0 0
cpu0 63181 0 17125 545200 225 0 1111 36 0 0
cpu1 65244 0 18833 540505 1206 0 1213 42 0 0
intr 1 2 3
`

func TestParseProcStat(t *testing.T) {
	got, err := ParseProcStat([]byte(procStat))
	if err != nil {
		t.Fatal(err)
	}
	want := CPUTimes{User: 1284.26, Nice: 0.07, System: 359.59, Idle: 10857.06, IOWait: 14.32, IRQ: 0.11, SoftIRQ: 23.25, Steal: 0.78}
	if got != want {
		t.Errorf("ParseProcStat = %+v, want %+v", got, want)
	}
	if busy := got.Busy(); math.Abs(busy-(1284.26+0.07+359.59+0.11+23.25)) > 1e-9 {
		t.Errorf("Busy = %v: must leave idle, iowait and steal out", busy)
	}
	for _, c := range []struct{ name, in, wantErr string }{
		{"per-CPU lines only", "cpu0 1 2 3 4 5 6 7 8\n", "no aggregate cpu line"},
		{"short line", "cpu  1 2 3 4\n", "4 fields"},
		{"not a number", "cpu  1 2 x 4 5 6 7 8\n", "field 3"},
	} {
		if _, err := ParseProcStat([]byte(c.in)); err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("%s: err %v, want %q", c.name, err, c.wantErr)
		}
	}
}

func TestParseCgroupCPUStat(t *testing.T) {
	got, err := ParseCgroupCPUStat([]byte("usage_usec 253909\nuser_usec 250119\nsystem_usec 3789\nnice_usec 0\n"))
	if err != nil || got != 0.253909 {
		t.Errorf("ParseCgroupCPUStat = %v, %v; want 0.253909", got, err)
	}
	if _, err := ParseCgroupCPUStat([]byte("user_usec 1\n")); err == nil {
		t.Error("no usage_usec: no error")
	}
}

func TestParseTaskStat(t *testing.T) {
	for _, c := range []struct {
		name, in, comm string
		secs           float64
	}{
		{"kernel thread", "14 (ksoftirqd/0) S 2 0 0 0 -1 69238848 0 0 0 0 12 345 0 0 20 0 1 0 3 0 0", "ksoftirqd/0", 3.57},
		{"comm with spaces and parens", "99 (a (b) c) R 1 99 99 0 -1 4194560 10 0 0 0 100 50 0 0 20 0 1 0 5", "a (b) c", 1.5},
	} {
		comm, secs, err := ParseTaskStat([]byte(c.in))
		if err != nil || comm != c.comm || math.Abs(secs-c.secs) > 1e-9 {
			t.Errorf("%s: %q %v %v, want %q %v", c.name, comm, secs, err, c.comm, c.secs)
		}
	}
	if _, _, err := ParseTaskStat([]byte("14 (x) S 2")); err == nil {
		t.Error("truncated stat: no error")
	}
}

// The cpu figure is the machine's busy time over the gigabytes received;
// its split and the endpoints' share are per GB too, idle is not.
func TestCPUCost(t *testing.T) {
	before := CPUSnapshot{Machine: CPUTimes{User: 10, System: 20, Idle: 100, SoftIRQ: 5}, Endpoints: 1, KSoftirqd: 2, Labs: 1}
	after := CPUSnapshot{Machine: CPUTimes{User: 11, System: 22, Idle: 101, SoftIRQ: 6, Steal: 0.5}, Endpoints: 3, KSoftirqd: 2.5, Labs: 1.5}
	m, err := CPUCost(before, after, 4e9)
	if err != nil {
		t.Fatal(err)
	}
	if m.Value != 1 { // 4 CPU-s busy over 4 GB
		t.Errorf("value %v, want 1 CPU-s/GB", m.Value)
	}
	for k, want := range map[string]float64{"user": 0.25, "system": 0.5, "softirq": 0.25, "irq": 0, "endpoints": 0.5,
		"ksoftirqd": 0.125, "labs": 0.125, "own": 0.75, "elsewhere": 0.25, "idle": 1, "steal": 0.5, "gigabytes": 4, "idleShare": 1 / 5.5} {
		if got, ok := m.Extra[k]; !ok || math.Abs(got-want) > 1e-12 {
			t.Errorf("extra[%s] = %v (present %v), want %v", k, got, ok, want)
		}
	}
	// Without the tools' cgroup the endpoints' share is absent, not zero,
	// and so is what ran elsewhere.
	before.Endpoints, after.Endpoints = -1, -1
	m, err = CPUCost(before, after, 4e9)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"endpoints", "elsewhere", "own"} {
		if _, ok := m.Extra[k]; ok {
			t.Errorf("%s present without a cgroup: %v", k, m.Extra)
		}
	}
	// Without the labs' share, elsewhere is what the endpoints and
	// ksoftirqd leave, and there is no own.
	before.Endpoints, after.Endpoints, before.Labs, after.Labs = 1, 3, -1, -1
	if m, err = CPUCost(before, after, 4e9); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Extra["own"]; ok || m.Extra["elsewhere"] != 0.375 {
		t.Errorf("without the labs' share: %v", m.Extra)
	}
	if _, err := CPUCost(before, after, 0); err == nil {
		t.Error("no bytes: no error")
	}
	if _, err := CPUCost(after, before, 1e9); err == nil {
		t.Error("counters going backwards: no error")
	}
}

// This machine's /proc/stat and ksoftirqd threads are readable as the
// bench reads them (no root needed).
func TestCPUMeterReadsThisMachine(t *testing.T) {
	m := newCPUMeter("", "")
	if len(m.ksoftirqd) == 0 {
		t.Error("no ksoftirqd threads found")
	}
	s, err := m.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if s.Machine.Busy() <= 0 || s.Endpoints != -1 || s.KSoftirqd < 0 {
		t.Errorf("snapshot %+v", s)
	}
}

// The labs' share counts the processes whose command line names the
// state root, and nothing else: a busy shell named after one root shows
// under it, not under another.
func TestLabsCPUCountsTheProcessesNamingTheRoot(t *testing.T) {
	root, other := t.TempDir(), t.TempDir()
	cmd := exec.Command("sh", "-c", "while :; do :; done", filepath.Join(root, "lab", "x"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	testenv.Eventually(t, "the busy process's time under its root", 10*time.Second, func() bool { return labsCPU(root) > 0 })
	if got := labsCPU(other); got != 0 {
		t.Errorf("another root has %v s", got)
	}
}
