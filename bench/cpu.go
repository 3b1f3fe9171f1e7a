package main

// CPU time per gigabyte moved: the figure that shows what a path costs when
// its throughput is bounded by the endpoints' CPUs (single-stream TCP here
// swings 15-37 Gbit/s within one run, the CPU it takes per byte much less).
//
// Where the time is read, and why:
//
//   - The figure is the whole machine's busy time (/proc/stat: user, nice,
//     system, irq, softirq over all CPUs) during the transfer, over the bytes
//     the receivers got. Datapath work (tcx programs, veth and bridge
//     forwarding, routing, conntrack) runs in softirq context: on the
//     sending task's CPU when softirqs run on its local_bh_enable, in
//     ksoftirqd when they pile up, or on top of the idle task. Only the
//     machine-wide count sees all three. It also sees everything else the
//     machine does in the window (the labs' daemons, which every lab variant
//     pays alike, and anything else running), so it is a figure for a quiet
//     machine; the samples record the load average and the idle time.
//   - Recorded beside it, per sample: the same time split by kind, the CPU
//     time of the processes the bench runs (iperf3 clients and servers,
//     from a cgroup v2 the bench puts them in: cpu.stat usage_usec) and of
//     the ksoftirqd threads. The cgroup's time is its tasks' scheduler
//     runtime, which includes softirq work run in their context unless
//     the kernel takes IRQ time out of it (CONFIG_IRQ_TIME_ACCOUNTING,
//     which this machine's kernel lacks); softirq work in ksoftirqd or
//     over idle is charged to no cgroup of the bench at all. That is why
//     the machine figure is the one compared. Also recorded: the labs' own
//     processes (every process whose command line names the bench's state
//     root: controllers, agents, and the gateway and xTR daemons, which do
//     a proxy's work for the cloud scenarios), and "own", the endpoints,
//     the labs and ksoftirqd together: the CPU the measured path's own
//     tasks spent, which other work on the machine inflates far less than
//     the machine figure (issue 20: with other builds running, "elsewhere"
//     was most of the gateway's figure). What is left after endpoints, labs
//     and ksoftirqd is recorded as "elsewhere"; since /proc/stat counts
//     ticks and cpu.stat exact runtime, it can dip slightly below 0.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// userHZ is the unit of /proc/stat and /proc/PID/stat times: USER_HZ,
// which the kernel fixes at 100 on every architecture Go runs Linux on
// (sysconf(_SC_CLK_TCK) would need cgo to ask).
const userHZ = 100

// CPUTimes is the machine's CPU time by kind, in seconds, summed over all
// CPUs (the "cpu" line of /proc/stat). Guest time is already inside User.
type CPUTimes struct {
	User, Nice, System, Idle, IOWait, IRQ, SoftIRQ, Steal float64
}

// Busy is the time the CPUs spent working for this machine: everything but
// idle, iowait (idle with I/O pending) and steal (time the hypervisor gave
// to someone else).
func (t CPUTimes) Busy() float64 { return t.User + t.Nice + t.System + t.IRQ + t.SoftIRQ }

// Sub returns t - u, kind by kind.
func (t CPUTimes) Sub(u CPUTimes) CPUTimes {
	return CPUTimes{User: t.User - u.User, Nice: t.Nice - u.Nice, System: t.System - u.System,
		Idle: t.Idle - u.Idle, IOWait: t.IOWait - u.IOWait, IRQ: t.IRQ - u.IRQ,
		SoftIRQ: t.SoftIRQ - u.SoftIRQ, Steal: t.Steal - u.Steal}
}

// ParseProcStat reads the aggregate "cpu" line of /proc/stat.
func ParseProcStat(b []byte) (CPUTimes, error) {
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "cpu" {
			continue
		}
		// user nice system idle iowait irq softirq steal [guest guest_nice]
		if len(f) < 9 {
			return CPUTimes{}, fmt.Errorf("/proc/stat: cpu line has %d fields, want at least 8: %q", len(f)-1, line)
		}
		v := make([]float64, 8)
		for i := range v {
			n, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				return CPUTimes{}, fmt.Errorf("/proc/stat: cpu field %d: %w", i+1, err)
			}
			v[i] = float64(n) / userHZ
		}
		return CPUTimes{User: v[0], Nice: v[1], System: v[2], Idle: v[3], IOWait: v[4], IRQ: v[5], SoftIRQ: v[6], Steal: v[7]}, nil
	}
	return CPUTimes{}, errors.New("/proc/stat: no aggregate cpu line")
}

// ParseCgroupCPUStat returns usage_usec of a cgroup v2 cpu.stat, in seconds.
// The file has it whether or not the cpu controller is enabled.
func ParseCgroupCPUStat(b []byte) (float64, error) {
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == "usage_usec" {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cpu.stat usage_usec: %w", err)
			}
			return float64(n) / 1e6, nil
		}
	}
	return 0, errors.New("cpu.stat: no usage_usec")
}

// ParseTaskStat returns a task's comm and its user+system time in seconds
// from /proc/PID/stat. The comm is in parentheses and may itself hold
// spaces and parentheses, so the fields are counted from the last ')'.
func ParseTaskStat(b []byte) (comm string, seconds float64, err error) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", 0, fmt.Errorf("task stat: no (comm) in %.80q", b)
	}
	comm = string(b[open+1 : end])
	// After the comm: state(3) ppid(4) ... utime(14) stime(15).
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 13 {
		return "", 0, fmt.Errorf("task stat of %s: %d fields after comm, want at least 13", comm, len(f))
	}
	var sum float64
	for _, s := range f[11:13] {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return "", 0, fmt.Errorf("task stat of %s: %w", comm, err)
		}
		sum += float64(n)
	}
	return comm, sum / userHZ, nil
}

// CPUSnapshot is what the bench reads at each end of a transfer.
type CPUSnapshot struct {
	Machine   CPUTimes
	Endpoints float64 // the bench's tools' cgroup, seconds; negative: no cgroup
	KSoftirqd float64 // all ksoftirqd threads, seconds; negative: not read
	Labs      float64 // the labs' processes (command line names the state root), seconds; negative: not read
}

// CPUCost turns the snapshots around a transfer of bytes into the cpu
// figure's sample: busy CPU-seconds of the whole machine per GB (1e9 bytes)
// received, with the split by kind (per GB), the endpoints' and ksoftirqd's
// share and what ran elsewhere (per GB, when both were read at both ends)
// and the window's idle and steal
// time (CPU-seconds) and idle's share of all CPU time in the window in Extra.
func CPUCost(before, after CPUSnapshot, bytes float64) (Measurement, error) {
	if bytes <= 0 {
		return Measurement{}, errors.New("cpu per GB: no bytes moved")
	}
	d := after.Machine.Sub(before.Machine)
	if d.Busy() < 0 || d.Idle < 0 {
		return Measurement{}, errors.New("cpu per GB: /proc/stat went backwards")
	}
	gb := bytes / 1e9
	extra := map[string]float64{
		"gigabytes": gb,
		"user":      (d.User + d.Nice) / gb,
		"system":    d.System / gb,
		"softirq":   d.SoftIRQ / gb,
		"irq":       d.IRQ / gb,
		"idle":      d.Idle + d.IOWait,
		"steal":     d.Steal,
	}
	if all := d.Busy() + d.Idle + d.IOWait + d.Steal; all > 0 {
		extra["idleShare"] = (d.Idle + d.IOWait) / all
	}
	if before.Endpoints >= 0 && after.Endpoints >= 0 {
		extra["endpoints"] = (after.Endpoints - before.Endpoints) / gb
	}
	if before.KSoftirqd >= 0 && after.KSoftirqd >= 0 {
		extra["ksoftirqd"] = (after.KSoftirqd - before.KSoftirqd) / gb
	}
	// The rest: softirq work charged to the idle task, the launchers, the
	// labs' daemons, and whatever else the machine ran. Large next to the
	// others, it says the machine was not quiet.
	if before.Labs >= 0 && after.Labs >= 0 {
		extra["labs"] = (after.Labs - before.Labs) / gb
	}
	ep, okE := extra["endpoints"]
	ks, okK := extra["ksoftirqd"]
	lb, okL := extra["labs"]
	if okE && okK && okL {
		extra["own"] = ep + lb + ks
		extra["elsewhere"] = d.Busy()/gb - ep - lb - ks
	} else if okE && okK {
		extra["elsewhere"] = d.Busy()/gb - ep - ks
	}
	return Measurement{Value: d.Busy() / gb, Extra: extra}, nil
}

// cpuMeter reads CPU snapshots: the machine, the bench's tools' cgroup (if
// there is one) and the ksoftirqd threads (found once: they live as long
// as the machine).
type cpuMeter struct {
	cgroup    string // directory of the tools' cgroup; "" if none
	ksoftirqd []string
	labRoot   string // the labs' state root; "" = do not read the labs' share
}

func newCPUMeter(cgroup, labRoot string) *cpuMeter {
	m := &cpuMeter{cgroup: cgroup, labRoot: labRoot}
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range dirs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // gone since the glob
		}
		if comm, _, err := ParseTaskStat(b); err == nil && strings.HasPrefix(comm, "ksoftirqd/") {
			m.ksoftirqd = append(m.ksoftirqd, p)
		}
	}
	return m
}

// snapshot reads the counters; only the machine's are required.
func (m *cpuMeter) snapshot() (CPUSnapshot, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return CPUSnapshot{}, err
	}
	s := CPUSnapshot{Endpoints: -1, KSoftirqd: -1, Labs: -1}
	if s.Machine, err = ParseProcStat(b); err != nil {
		return CPUSnapshot{}, err
	}
	if m.cgroup != "" {
		b, err := os.ReadFile(filepath.Join(m.cgroup, "cpu.stat"))
		if err != nil {
			return CPUSnapshot{}, fmt.Errorf("tools' cgroup: %w", err)
		}
		if s.Endpoints, err = ParseCgroupCPUStat(b); err != nil {
			return CPUSnapshot{}, fmt.Errorf("tools' cgroup: %w", err)
		}
	}
	if len(m.ksoftirqd) > 0 {
		s.KSoftirqd = 0
		for _, p := range m.ksoftirqd {
			b, err := os.ReadFile(p)
			if err != nil {
				s.KSoftirqd = -1 // a CPU went offline: leave the share out
				break
			}
			_, secs, err := ParseTaskStat(b)
			if err != nil {
				return CPUSnapshot{}, err
			}
			s.KSoftirqd += secs
		}
	}
	if m.labRoot != "" {
		s.Labs = labsCPU(m.labRoot)
	}
	return s, nil
}

// labsCPU is the user+system time, in seconds, of every process whose
// command line names a path under root: the labs' daemons, which the
// bench starts with `lab up --root`. The set is read anew each time; a
// daemon is as long-lived as its lab, so one that came or went in between
// is not in a transfer's window.
func labsCPU(root string) float64 {
	needle := []byte(strings.TrimSuffix(root, "/") + "/")
	var sum float64
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cmd, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || !bytes.Contains(cmd, needle) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "stat"))
		if err != nil {
			continue // gone since the glob
		}
		if _, secs, err := ParseTaskStat(b); err == nil {
			sum += secs
		}
	}
	return sum
}
