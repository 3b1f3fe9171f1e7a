package main

// The shared runner: what a scenario is, the figures, the schedule of
// rounds (every scenario in every round, in rotated order), taking one
// sample of a test on a scenario (its pairs at once, the CPU window around
// them, one retry), and the loop that records samples into the report.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Scenario is one way of carrying traffic, measured beside the others in
// every round. A scenario lives in its own file (scenario_NAME.go) and is
// registered by one line in scenarios.go.
type Scenario struct {
	Name        string
	Description string
	// Build makes what the scenario runs on, or finds it when another
	// scenario made it already (Env.Lab, Env.Once), and returns the
	// sender -> receiver pairs that run at once. Whatever it makes must be
	// named so that Env.cleanup finds it: a lab (Env.Lab) or a namespace
	// (Env.Netns) and what lives inside those.
	Build func(ctx context.Context, e *Env) ([]*Pair, error)
	// Baselines are the scenarios this one is compared with: one ratio of
	// medians per figure, this scenario's over the baseline's.
	Baselines []Baseline
	// Checks, if set, measures what the figures cannot show (how many of
	// a TAP policy's copies arrive, say), once after the rounds, on the
	// pairs Build returned.
	Checks func(ctx context.Context, e *Env, pairs []*Pair) ([]Check, error)
	// Tests, if not nil, are the tests this scenario runs in every round
	// instead of the default ones (tests): rr and crr are run only where
	// asked for; an empty list runs none (a scenario of Checks only).
	Tests []string
}

// Check is one scenario-specific measurement against its target.
type Check struct {
	Scenario string  `json:"scenario"`
	Name     string  `json:"name"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	// Op and Target: the target, if any (">=" or "<="); Met says
	// whether Value reaches it.
	Op     string  `json:"op,omitempty"`
	Target float64 `json:"target,omitempty"`
	Met    *bool   `json:"met,omitempty"`
	Detail string  `json:"detail,omitempty"`
}

// Baseline is a scenario another is compared with, and the targets (by
// figure key) an issue set for the ratio; a figure without one is
// informational.
type Baseline struct {
	Scenario string
	Targets  map[string]Target
}

// Target is the ratio of medians a comparison must reach: at least Ratio
// where higher is better, at most Ratio where lower is (RTT, CPU per GB);
// Strict: beat it, not only reach it.
type Target struct {
	Ratio  float64
	Strict bool
}

// Pair is one sender and one receiver.
type Pair struct {
	DstIP string
	// Src and Dst build a command running inside the sending and the
	// receiving namespace. The command must exec the tool in the process
	// it starts (as `ip netns exec` and `onehop lab exec` do), so the CPU
	// window can open once the tool runs.
	Src, Dst Cmd
	// Server names the receiver's iperf3 server: pairs with the same
	// receiver share one.
	Server string
}

// figure is one measured quantity. Values are kept in base units (bit/s,
// CPU-seconds per GB, µs, datagrams/s) and divided by scale for printing.
type figure struct {
	key           string
	title         string
	baseUnit      string
	unit          string
	scale         float64
	digits        int
	lowerIsBetter bool
}

var figures = []figure{
	{key: "tcp", title: "TCP throughput, 1 stream per pair", baseUnit: "bit/s", unit: "Gbit/s", scale: 1e9, digits: 2},
	{key: "cpu", title: "CPU per GB moved by TCP, whole machine", baseUnit: "CPU-s/GB", unit: "CPU-ms/GB", scale: 1e-3, digits: 0, lowerIsBetter: true},
	{key: "rtt", title: "ping RTT, avg", baseUnit: "µs", unit: "µs", scale: 1, digits: 1, lowerIsBetter: true},
	{key: "udp64", title: "UDP 64 B received", baseUnit: "datagrams/s", unit: "kpps", scale: 1e3, digits: 1},
	{key: "rr", title: "TCP request/response, 1 B each way, one connection", baseUnit: "transactions/s", unit: "k/s", scale: 1e3, digits: 2},
	{key: "crr", title: "TCP connection setup: connect, 1 B each way, close", baseUnit: "connections/s", unit: "k/s", scale: 1e3, digits: 2},
	{key: "cps", title: "TCP short connections: connect, 1 B each way, the server closes first", baseUnit: "connections/s", unit: "k/s", scale: 1e3, digits: 2},
}

func figureByKey(key string) (figure, bool) {
	for _, f := range figures {
		if f.key == key {
			return f, true
		}
	}
	return figure{}, false
}

// tests are what one step runs, in this order on each scenario that does
// not name its own (Scenario.Tests); a test yields samples of one or more
// figures (tcp also gives cpu: the CPU time of the same transfer).
var tests = []string{"tcp", "rtt", "udp64"}

// testsOf are the tests s runs in every round.
func testsOf(s *Scenario) []string {
	if s.Tests != nil {
		return s.Tests
	}
	return tests
}

// figuresOf are the figures s measures: its tests', tcp's cpu too.
func figuresOf(s *Scenario) map[string]bool {
	out := map[string]bool{}
	for _, t := range testsOf(s) {
		out[t] = true
		if t == "tcp" {
			out["cpu"] = true
		}
	}
	return out
}

// Step is one test on one scenario in one round.
type Step struct {
	Round    int // from 1
	Slot     int // the scenario's place in this round's order, from 1
	Scenario string
	Test     string
}

// Schedule returns the steps of a run: every round runs every scenario, in
// the round's rotation of their order (Rotation), and every test on a
// scenario before the next one, so drift and noise on the machine hit
// every scenario alike and none always goes first or last.
func Schedule(scenarios, tests []string, rounds int) []Step {
	return schedule(scenarios, func(string) []string { return tests }, rounds)
}

// ScheduleScenarios is Schedule with each scenario's own tests (testsOf).
func ScheduleScenarios(scenarios []*Scenario, rounds int) []Step {
	names := make([]string, len(scenarios))
	byName := map[string]*Scenario{}
	for i, s := range scenarios {
		names[i], byName[s.Name] = s.Name, s
	}
	return schedule(names, func(n string) []string { return testsOf(byName[n]) }, rounds)
}

func schedule(scenarios []string, testsOf func(string) []string, rounds int) []Step {
	var out []Step
	for r := 0; r < rounds; r++ {
		for slot, i := range Rotation(len(scenarios), r) {
			for _, t := range testsOf(scenarios[i]) {
				out = append(out, Step{Round: r + 1, Slot: slot + 1, Scenario: scenarios[i], Test: t})
			}
		}
	}
	return out
}

// comparison is one ratio of medians the report gives: subject over
// baseline for one figure, with the target when there is one.
type comparison struct {
	subject, baseline, figure string
	target                    float64 // 0: informational
	strict                    bool
}

// Comparisons expands the scenarios' baselines into one comparison per
// figure both sides measure, in the scenarios' order, leaving out those
// with a side that does not run (a run of some scenarios only). It fails on
// a baseline or target that names nothing, so a typo cannot silently drop
// a comparison.
func Comparisons(all []*Scenario, running []string) ([]comparison, error) {
	known := map[string]*Scenario{}
	for _, s := range all {
		known[s.Name] = s
	}
	runs := map[string]bool{}
	for _, n := range running {
		runs[n] = true
	}
	var out []comparison
	for _, s := range all {
		for _, b := range s.Baselines {
			if known[b.Scenario] == nil || b.Scenario == s.Name {
				return nil, fmt.Errorf("scenario %s: baseline %q is not another scenario", s.Name, b.Scenario)
			}
			mine, theirs := figuresOf(s), figuresOf(known[b.Scenario])
			for k := range b.Targets {
				if _, ok := figureByKey(k); !ok {
					return nil, fmt.Errorf("scenario %s: target for unknown figure %q", s.Name, k)
				}
				if !mine[k] || !theirs[k] {
					return nil, fmt.Errorf("scenario %s: target for figure %q, which it or %s does not measure", s.Name, k, b.Scenario)
				}
			}
			if !runs[s.Name] || !runs[b.Scenario] {
				continue
			}
			for _, f := range figures {
				if !mine[f.key] || !theirs[f.key] {
					continue
				}
				t := b.Targets[f.key]
				out = append(out, comparison{subject: s.Name, baseline: b.Scenario, figure: f.key, target: t.Ratio, strict: t.Strict})
			}
		}
	}
	return out, nil
}

// Select returns the registered scenarios named in list (comma-separated,
// in registration order), or all of them for "" or "all".
func Select(all []*Scenario, list string) ([]*Scenario, error) {
	if list == "" || list == "all" {
		return all, nil
	}
	want := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		if n = strings.TrimSpace(n); n != "" {
			want[n] = true
		}
	}
	var out []*Scenario
	for _, s := range all {
		if want[s.Name] {
			out = append(out, s)
			delete(want, s.Name)
		}
	}
	if len(want) > 0 {
		var names, unknown []string
		for _, s := range all {
			names = append(names, s.Name)
		}
		for n := range want {
			unknown = append(unknown, n)
		}
		return nil, fmt.Errorf("no scenario %s (there are: %s)", strings.Join(unknown, ", "), strings.Join(names, ", "))
	}
	if len(out) == 0 {
		return nil, errors.New("-scenarios names no scenario")
	}
	return out, nil
}

// measureFunc takes the samples of one step.
type measureFunc func(ctx context.Context, st Step) ([]Sample, error)

// runSteps runs the steps in order and adds their samples to the report,
// stopping at the first error or when ctx ends.
func runSteps(ctx context.Context, steps []Step, measure measureFunc, rep *Report) error {
	for _, st := range steps {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		samples, err := measure(ctx, st)
		if err != nil {
			return fmt.Errorf("round %d %s %s: %w", st.Round, st.Scenario, st.Test, err)
		}
		for _, s := range samples {
			s.Round, s.Slot, s.Variant = st.Round, st.Slot, st.Scenario
			rep.add(s)
		}
	}
	return nil
}

// runner measures the scenarios of one run on a real machine.
type runner struct {
	env   *Env
	cfg   config
	pairs map[string][]*Pair // by scenario
}

// setup builds each scenario, checks that each pair carries a ping, starts
// the servers its tests need in each receiver (iperf3, rrperf) and warms
// each TCP path up.
func (r *runner) setup(ctx context.Context, scenarios []*Scenario) error {
	r.pairs = map[string][]*Pair{}
	for _, s := range scenarios {
		pairs, err := s.Build(ctx, r.env)
		if err != nil {
			return fmt.Errorf("scenario %s: %w", s.Name, err)
		}
		figs := figuresOf(s)
		if len(pairs) == 0 && len(figs) > 0 {
			return fmt.Errorf("scenario %s: no pairs", s.Name)
		}
		r.pairs[s.Name] = pairs
		for _, p := range pairs {
			// A path that does not carry a ping is a broken setup, not a
			// figure. (It also lets onehop's ARP engine learn the path.)
			if _, err := output(p.Src(ctx, "ping", "-c", "3", "-i", "0.2", "-W", "2", p.DstIP)); err != nil {
				return fmt.Errorf("%s: the source cannot reach %s: %w", s.Name, p.DstIP, err)
			}
			if figs["rr"] || figs["crr"] {
				if err := r.env.startRRServer(ctx, p); err != nil {
					return err
				}
			}
			if figs["cps"] {
				if err := r.env.startCPSServer(ctx, p); err != nil {
					return err
				}
			}
			if !figs["tcp"] && !figs["udp64"] {
				continue
			}
			if err := r.env.startServer(ctx, p); err != nil {
				return err
			}
		}
		if !figs["tcp"] {
			continue
		}
		// One unrecorded TCP run: the first transfer on a fresh path pays
		// for neighbour resolution, page faults and cold caches.
		progress("setup: %s warm-up (1 s of TCP, not recorded)", s.Name)
		if _, err := r.measure(ctx, s.Name, "tcp", 1); err != nil {
			return fmt.Errorf("%s warm-up: %w", s.Name, err)
		}
	}
	return nil
}

// step takes the samples of one step and reports progress.
func (r *runner) step(ctx context.Context, st Step) ([]Sample, error) {
	samples, err := r.measure(ctx, st.Scenario, st.Test, r.cfg.seconds)
	for _, s := range samples {
		f, _ := figureByKey(s.Figure)
		note := ""
		if lost := s.Extra["lost"]; s.Figure == "rtt" && lost > 0 {
			note = fmt.Sprintf(" (%v of %v echoes lost)", lost, s.Extra["sent"])
		}
		if s.Retried {
			note += " (retried)"
		}
		progress("round %d/%d: %-9s %-5s %*.*f %s%s", st.Round, r.cfg.rounds, st.Scenario, s.Figure,
			8, f.digits, s.Value/f.scale, f.unit, note)
	}
	return samples, err
}

// measure takes one sample of test on a scenario: its pairs at once, rates
// summed and RTTs averaged (Combine); tcp also yields the cpu figure of the
// same transfer. A failed try is run once more, all pairs again (a pair
// measured alone would not be the scenario's figure), after restarting an
// iperf3 server that has gone (on a shared machine, something may kill
// iperf3 by name); a second failure ends the bench.
func (r *runner) measure(ctx context.Context, scenario, test string, secs int) ([]Sample, error) {
	pairs := r.pairs[scenario]
	for attempt := 0; ; attempt++ {
		samples, err := r.try(ctx, pairs, test, secs)
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if err == nil {
			for i := range samples {
				samples[i].Retried = attempt > 0
			}
			return samples, nil
		}
		if attempt == 1 {
			return nil, err
		}
		progress("  %s %s failed: %v; retrying once", scenario, test, err)
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(time.Second):
		}
		if test != "rtt" {
			for _, p := range pairs {
				if s := r.env.serverFor(p, test); s != nil && s.exited() {
					if err := r.env.restartServer(ctx, p, test); err != nil {
						return nil, err
					}
				}
			}
		}
	}
}

// try runs test once on all pairs at once. For tcp the CPU window opens
// when every client has become iperf3 (the launchers' own start-up, which
// differs between `ip netns exec` and `onehop lab exec`, stays out of it)
// and closes when the last one has exited.
func (r *runner) try(ctx context.Context, pairs []*Pair, test string, secs int) ([]Sample, error) {
	var argv []string
	var parse func([]byte) (Measurement, error)
	switch test {
	case "tcp":
		// bbr, this kernel's default, is slow between namespaces here;
		// cubic is set per socket (a namespace may not change its default).
		argv = []string{"iperf3", "-c", "", "-p", iperfPort, "-t", strconv.Itoa(secs), "-C", "cubic", "-J"}
		parse = ParseIperfTCP
	case "udp64":
		// -b 0: as fast as the sender can; the figure is what arrives.
		argv = []string{"iperf3", "-c", "", "-p", iperfPort, "-u", "-l", strconv.Itoa(udpLen), "-b", "0", "-t", strconv.Itoa(secs), "-J"}
		parse = func(out []byte) (Measurement, error) { return ParseIperfUDP(out, udpLen) }
	case "rtt":
		argv = []string{"ping", "-c", strconv.Itoa(r.cfg.pings), "-i", pingGap, ""}
		parse = ParsePing
	case "rr", "crr":
		a, err := rrperfArgv("-mode", test, "-c", "", "-p", rrPort, "-t", strconv.Itoa(secs))
		if err != nil {
			return nil, err
		}
		argv, parse = pinned(rrClientCPU, a), ParseRR
	case "cps":
		a, err := rrperfArgv("-mode", test, "-c", "", "-p", cpsPort, "-t", strconv.Itoa(secs))
		if err != nil {
			return nil, err
		}
		argv, parse = pinned(rrClientCPU, a), ParseCPS
	default:
		return nil, fmt.Errorf("unknown test %q", test)
	}
	// A test that outlives its length by this much is hung, not slow.
	tctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+30*time.Second)
	defer cancel()
	runs := make([]*toolRun, len(pairs))
	for i, p := range pairs {
		a := append([]string(nil), argv...)
		switch test {
		case "rtt":
			a[len(a)-1] = p.DstIP
		case "rr", "crr", "cps":
			// taskset -c CPU ... rrperf -mode M -c HOST: rrperf's -c
			a[slices.Index(a, rrperfArg)+4] = p.DstIP
		default:
			a[2] = p.DstIP
		}
		runs[i] = &toolRun{cmd: r.env.tool(p.Src(tctx, a...))}
	}
	var errs []error
	for _, run := range runs {
		errs = append(errs, run.start())
	}
	if err := errors.Join(errs...); err != nil {
		cancel() // the others' figure would not be the scenario's
		for _, run := range runs {
			run.wait()
		}
		return nil, err
	}
	var before CPUSnapshot
	var cpuErr error
	if test == "tcp" {
		for _, run := range runs {
			run.awaitExec(argv[0])
		}
		before, cpuErr = r.env.cpu.snapshot()
	}
	var wg sync.WaitGroup
	for _, run := range runs {
		wg.Add(1)
		go func() { defer wg.Done(); run.wait() }()
	}
	wg.Wait()
	var after CPUSnapshot
	if test == "tcp" && cpuErr == nil {
		after, cpuErr = r.env.cpu.snapshot()
	}

	ms := make([]Measurement, len(pairs))
	errs = errs[:0]
	for i, run := range runs {
		m, err := parse(run.stdout.Bytes())
		switch {
		case err == nil && run.err == nil:
			ms[i] = m
			continue
		case err == nil:
			err = run.err
		case run.err != nil && test == "rtt":
			err = run.err // ping's own message says more than "no summary"
		}
		if s := r.env.serverFor(pairs[i], test); s != nil && s.exited() {
			err = fmt.Errorf("%w (the %s server had exited: %v: %s)", err, s.cmd.Args[0], s.err, tailFile(s.log))
		}
		errs = append(errs, fmt.Errorf("-> %s: %w", pairs[i].DstIP, err))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	now, load := time.Now().UTC(), load1()
	f, _ := figureByKey(test)
	m := Combine(test, ms)
	out := []Sample{{Figure: test, Value: m.Value, Unit: f.baseUnit, Extra: m.Extra, At: now, Load1: load}}
	if test == "tcp" {
		if cpuErr != nil {
			return nil, fmt.Errorf("cpu time: %w", cpuErr)
		}
		var bytes float64
		for _, m := range ms {
			bytes += m.Extra["receivedBytes"]
		}
		c, err := CPUCost(before, after, bytes)
		if err != nil {
			return nil, err
		}
		cf, _ := figureByKey("cpu")
		out = append(out, Sample{Figure: "cpu", Value: c.Value, Unit: cf.baseUnit, Extra: c.Extra, At: now, Load1: load})
	}
	return out, nil
}

// toolRun is one measuring tool running in a pair's sender.
type toolRun struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	err            error
	started        bool
}

func (t *toolRun) start() error {
	t.cmd.Stdout, t.cmd.Stderr = &t.stdout, &t.stderr
	if err := t.cmd.Start(); err != nil {
		t.err = err
		return fmt.Errorf("%s: %w", strings.Join(t.cmd.Args, " "), err)
	}
	t.started = true
	return nil
}

// awaitExec waits (up to 2 s) until the launcher has exec'd the tool: its
// process's command name is tool's, or it has exited.
func (t *toolRun) awaitExec(tool string) {
	if !t.started {
		return
	}
	comm := fmt.Sprintf("/proc/%d/comm", t.cmd.Process.Pid)
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		b, err := os.ReadFile(comm)
		if err != nil || strings.TrimSpace(string(b)) == tool {
			return
		}
		// Polled: an exec gives no event to wait on. 1 ms is short next
		// to a test of seconds, and the window is not open yet.
		time.Sleep(time.Millisecond)
	}
}

func (t *toolRun) wait() {
	if !t.started {
		return
	}
	if err := t.cmd.Wait(); err != nil {
		t.err = cmdError(t.cmd, err, t.stdout.Bytes(), t.stderr.Bytes())
	}
}
