// Command scale runs the control plane's scale harness (internal/scale):
// `make bench-scale` runs it at issue 12's size against the embedded etcd
// and against an external 3-member cluster with its leader killed.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/onehop/onehop/internal/scale"
)

func main() {
	var cfg scale.Config
	var out string
	var cluster bool
	flag.IntVar(&cfg.Hosts, "hosts", 1000, "simulated hosts (one real agent each)")
	flag.IntVar(&cfg.VMs, "vms", 10000, "VMs to create through the REST API")
	flag.IntVar(&cfg.Farms, "farms", 100, "farms the VMs are spread over")
	flag.IntVar(&cfg.SubnetsPerFarm, "subnets", 4, "subnets per farm")
	flag.IntVar(&cfg.RuleChanges, "rule-changes", 200, "rules added one at a time, each timed (200: a p99 that is not just the slowest)")
	flag.IntVar(&cfg.Revocations, "revocations", 100, "rules deleted one at a time after the rule changes, each timed (issue 21)")
	flag.IntVar(&cfg.Moves, "moves", 20, "VMs moved one at a time, each timed")
	flag.IntVar(&cfg.Block, "block", 1000, "creates per line of the create table")
	flag.IntVar(&cfg.APIClients, "api-clients", 1, "creates in flight at once")
	flag.IntVar(&cfg.AgentsPerClient, "agents-per-client", 1, "simulated agents sharing one etcd connection")
	flag.DurationVar(&cfg.Resync, "resync", 2*time.Second, "the agents' --resync")
	flag.DurationVar(&cfg.StatusEvery, "status-interval", 0, "the agents' --status-interval (0: the agent's default)")
	flag.DurationVar(&cfg.Wait, "wait", 5*time.Minute, "longest wait for agents to apply one step")
	flag.StringVar(&cfg.Binary, "binary", "", "onehop binary: run the controller as its own process (its memory measured apart)")
	flag.BoolVar(&cluster, "cluster", false, "an external 3-member etcd cluster (etcd on PATH), its leader killed at half the creates")
	flag.StringVar(&out, "out", "", "write the report as JSON here too")
	var cpuprofile string
	flag.StringVar(&cpuprofile, "cpuprofile", "", "write a CPU profile of this process (the simulated agents; the controller too unless -binary) here")
	flag.Parse()
	if cpuprofile != "" {
		f, err := os.Create(cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "scale:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "scale:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if cluster {
		etcd, err := exec.LookPath("etcd")
		if err != nil {
			fmt.Fprintln(os.Stderr, "scale: --cluster needs etcd on PATH (make deps installs etcd-server)")
			os.Exit(2)
		}
		cfg.Cluster, cfg.EtcdBinary, cfg.KillMember = 3, etcd, true
	}
	dir, err := os.MkdirTemp("", "onehop-scale-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	cfg.Dir, cfg.Progress = dir, os.Stdout
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	r, err := scale.Run(ctx, cfg)
	if r != nil {
		r.Print(os.Stdout)
		if out != "" {
			b, _ := json.MarshalIndent(r, "", "  ")
			if werr := os.WriteFile(out, b, 0o644); werr != nil {
				fmt.Fprintln(os.Stderr, "scale:", werr)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		fmt.Fprintln(os.Stderr, "scale: logs kept in", dir)
		pprof.StopCPUProfile()
		os.Exit(1) // keeps dir: the controller's and etcd members' logs say why
	}
}
