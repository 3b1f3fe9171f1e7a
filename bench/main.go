// Command bench measures onehop against its baselines in one run, side by
// side. Each way of carrying traffic is a scenario (scenario_*.go, listed
// in scenarios.go):
//
//   - onehop:   vm1 -> vm2, one subnet, across two hosts of a lab with
//     onehop's eBPF datapath;
//   - routed:   vm1 -> vm3, from one subnet to another (one-hop routing), in
//     the same lab; routed-2: vm1 -> vm3 and vm4 -> vm5 at once;
//   - router:   vm1 -> vm3 in a lab built with `datapath: bridge`, through a
//     routing namespace on the fabric that is both subnets' gateway (the
//     paper's "routing VM"); router-2: vm1 -> vm3 and vm4 -> vm5 at once;
//   - bridge:   vm1 -> vm2 in that bridge lab: a Linux bridge per host and
//     no virtualization (the physical reference);
//   - veth:     one raw veth pair between two namespaces (the floor);
//   - tapguest, tapguest-plain: a guest on a tap on h1 -> vm2 on h2, the
//     onehop scenario's path from a QEMU-like guest: a namespace whose NIC
//     is a tap, joined to h1's tap by a relay process copying frames
//     between the two fds, with a vnet_hdr and offloads or without
//     (scenario_tapguest.go, taprelay.go, docs/guests.md);
//   - cni: a container's wait from its runtime's `cnitool add` to the
//     first echo reply from its gateway, onehop's CNI plugin on h1 beside
//     the reference bridge plugin, p50 and p99 (scenario_cni.go,
//     echoprobe.go, docs/guests.md);
//   - vnat-base, vnat1, vnat2: connection migration's configurations (no
//     VNAT, VNAT with nothing migrated, every connection migrated), with
//     request/response and connection setup rates too; vnat-restore: the
//     time to restore 10 to 10,000 connections after a move, with the real
//     daemons (scenario_vnat*.go, docs/connection-migration.md);
//   - trace: `onehop trace` latency on a two-host path, p50 and p99,
//     beside a plain API read in the same run (scenario_trace.go,
//     docs/troubleshooting.md).
//
// Per scenario and round it takes single-stream TCP throughput (iperf3,
// cubic) and the CPU time the whole machine spent per GB of it (cpu.go says
// why the whole machine), ping RTT, and the rate of 64-byte UDP datagrams
// received (two-pair scenarios: both pairs at once, rates summed, RTTs
// averaged). Scenarios are interleaved inside every round, in rotated
// order, so drift and noise on the machine hit them alike; the report gives
// min/median/max per figure and the ratio of medians for each comparison a
// scenario declares, with the issues' targets.
//
//	go run ./bench -binary bin/onehop -rounds 5 -out bench/results/latest.json
//	go run ./bench -binary bin/onehop -quick -out /tmp/bench-quick.json
//	go run ./bench -binary bin/onehop -quick -scenarios onehop,bridge -out /tmp/b.json
//
// It needs root. Everything it creates (its labs under -root, its own
// namespaces, iperf3 servers, the tools' cgroup) is removed at the end, on
// error and on ^C, and leftovers of an interrupted earlier run are removed
// before it starts.
//
// A new scenario is a file scenario_NAME.go with a *Scenario (Build returns
// its pairs; Baselines its comparisons) and one line in scenarios.go.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

const (
	udpLen  = 64
	pingGap = "0.0005" // seconds between echoes (below 0.2 needs root); short, so idle-CPU wake-ups weigh less
)

type config struct {
	binary    string
	root      string
	out       string
	rounds    int
	seconds   int
	pings     int
	quick     bool
	scenarios string
}

// errInterrupted is the cause of the run's context when a signal stopped it.
var errInterrupted = errors.New("interrupted")

func main() {
	// The bench re-executes itself for its helper programs (helpers.go).
	if len(os.Args) > 1 && helperModes[os.Args[1]] != nil {
		os.Exit(helperModes[os.Args[1]](os.Args[2:]))
	}
	var cfg config
	flag.StringVar(&cfg.binary, "binary", "bin/onehop", "the onehop binary (`make build`)")
	flag.StringVar(&cfg.root, "root", defaultRoot, "state root for the bench's labs (kept apart from other labs)")
	flag.StringVar(&cfg.out, "out", "bench/results/latest.json", "where to write raw samples and the summary (JSON)")
	flag.IntVar(&cfg.rounds, "rounds", 5, "interleaved rounds; at least 5 for figures worth quoting")
	flag.IntVar(&cfg.seconds, "seconds", 3, "duration of each iperf3 test")
	flag.IntVar(&cfg.pings, "pings", 1000, "echoes per RTT sample")
	flag.BoolVar(&cfg.quick, "quick", false, "1 round of 1-second tests, to check the harness (an explicit -rounds/-seconds still wins)")
	flag.StringVar(&cfg.scenarios, "scenarios", "all", "comma-separated scenarios to run (comparisons need both sides): "+scenarioNames())
	flag.Parse()
	if cfg.quick {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["rounds"] {
			cfg.rounds = 1
		}
		if !set["seconds"] {
			cfg.seconds = 1
		}
	}
	selected, err := Select(scenarios, cfg.scenarios)
	if err == nil {
		err = checkSetup(&cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}

	// ^C, SIGTERM and SIGHUP cancel the run; cleanup then runs to the end
	// (its commands run in their own process groups, so a terminal's ^C does
	// not reach them, and further signals are only acknowledged).
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		for s := range sigs {
			if ctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "\nbench: %v: stopping, then cleaning up\n", s)
				cancel(errInterrupted)
			} else {
				fmt.Fprintln(os.Stderr, "bench: still cleaning up, please wait")
			}
		}
	}()

	err = run(ctx, cfg, selected)
	signal.Stop(sigs)
	switch {
	case errors.Is(err, errInterrupted):
		fmt.Fprintln(os.Stderr, "bench: interrupted; cleaned up")
		os.Exit(130)
	case err != nil:
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func scenarioNames() string {
	var names []string
	for _, s := range scenarios {
		names = append(names, s.Name)
	}
	return strings.Join(names, ",")
}

// checkSetup fails early, with a hint, on what would otherwise fail halfway.
func checkSetup(cfg *config) error {
	if cfg.rounds < 1 || cfg.seconds < 1 || cfg.pings < 1 {
		return errors.New("-rounds, -seconds and -pings must be at least 1")
	}
	if os.Geteuid() != 0 {
		return errors.New("needs root: it builds labs of network namespaces")
	}
	bin, err := filepath.Abs(cfg.binary)
	if err == nil {
		var fi os.FileInfo
		if fi, err = os.Stat(bin); err == nil && fi.Mode()&0o111 == 0 {
			err = errors.New("not executable")
		}
	}
	if err != nil {
		return fmt.Errorf("onehop binary %s: %v (run `make build`)", cfg.binary, err)
	}
	cfg.binary = bin // lab daemons are started from it, from any directory
	for _, tool := range []string{"ip", "iperf3", "ping", "ss"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found in PATH (`make deps` installs what the bench needs)", tool)
		}
	}
	return nil
}

func progress(format string, a ...any) { fmt.Fprintf(os.Stderr, format+"\n", a...) }

func run(ctx context.Context, cfg config, selected []*Scenario) (err error) {
	var names []string
	for _, s := range selected {
		names = append(names, s.Name)
	}
	comps, err := Comparisons(scenarios, names)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.root, 0o700); err != nil {
		return err
	}
	unlock, err := lockRoot(cfg.root)
	if err != nil {
		return err
	}
	defer unlock()

	e, err := newEnv(cfg)
	if err != nil {
		return err
	}
	defer e.close() // after cleanup (defers run last-in first-out)
	if left := e.leftovers(); len(left) > 0 {
		progress("setup: removing leftovers of an earlier run: %s", strings.Join(left, " "))
		if err := e.cleanup(); err != nil {
			return fmt.Errorf("leftovers of an earlier run: %w", err)
		}
	}
	// From here on, whatever happens, everything goes again.
	defer func() {
		progress("cleanup: iperf3 servers, the tools' cgroup, labs and namespaces of the bench")
		if cerr := e.cleanup(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", cerr))
		}
	}()
	stopped := func(err error) error {
		if context.Cause(ctx) == errInterrupted {
			return errInterrupted
		}
		return err
	}

	e.makeCgroup()
	e.cpu = newCPUMeter(e.cgroup, cfg.root)
	rep := newReport(cfg, comps)
	r := &runner{env: e, cfg: cfg}
	start := time.Now()
	if err := r.setup(ctx, selected); err != nil {
		return stopped(err)
	}
	progress("setup: done in %.0fs", time.Since(start).Seconds())
	for _, s := range selected {
		v := VariantInfo{Name: s.Name, Description: s.Description}
		for _, p := range r.pairs[s.Name] {
			v.DstIPs = append(v.DstIPs, p.DstIP)
		}
		rep.Variants = append(rep.Variants, v)
	}
	rep.Started = time.Now().UTC()
	if err := runSteps(ctx, ScheduleScenarios(selected, cfg.rounds), r.step, rep); err != nil {
		return stopped(err)
	}
	rep.Finished = time.Now().UTC()
	progress("measured %d round(s) in %.0fs", cfg.rounds, rep.Finished.Sub(rep.Started).Seconds())
	for _, s := range selected {
		if s.Checks == nil {
			continue
		}
		progress("checks: %s", s.Name)
		cs, err := s.Checks(ctx, e, r.pairs[s.Name])
		if err != nil {
			return stopped(fmt.Errorf("checks of %s: %w", s.Name, err))
		}
		rep.Checks = append(rep.Checks, cs...)
	}
	rep.summarize()
	rep.print(os.Stdout)
	if err := rep.write(cfg.out); err != nil {
		return err
	}
	fmt.Printf("\nraw samples and summary: %s\n", cfg.out)
	return nil
}
