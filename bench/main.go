// Command bench measures onehop against its baselines in one run: VM-to-VM
// traffic across two hosts through onehop's eBPF datapath, through the same
// lab built on Linux bridges (no virtualization: the physical reference), and
// through one raw veth pair. Variants are interleaved round by round, so
// machine noise hits them alike; the report gives min/median/max per figure
// and onehop's ratio of medians to each baseline.
//
//	go run ./bench -binary bin/onehop -rounds 5 -out bench/results/latest.json
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

const (
	labRoot   = "/run/onehop-bench"
	vethA     = "ohbench-a"
	vethB     = "ohbench-b"
	vethDstIP = "10.255.0.2"
)

// figure is one measured quantity.
type figure struct {
	Key         string
	Title       string
	Unit        string
	Scale       float64 // raw value / Scale = printed value
	LowerBetter bool
}

var figures = []figure{
	{"tcp", "TCP throughput, 1 stream", "Gbit/s", 1e9, false},
	{"udp64", "UDP 64-byte packets received", "kpps", 1e3, false},
	{"rtt", "ping RTT", "µs", 1, true},
}

// target is the goal for onehop against the bridge.
var target = map[string]float64{"tcp": 1.0, "udp64": 1.0, "rtt": 1.05}

// variant is one way of carrying the same traffic.
type variant struct {
	Name   string
	src    func(args ...string) *exec.Cmd
	dst    func(args ...string) *exec.Cmd
	dstIP  string
	server *exec.Cmd
}

type config struct {
	binary  string
	rounds  int
	seconds int
	pings   int
	out     string
}

func main() {
	var cfg config
	quick := flag.Bool("quick", false, "one round of 1-second tests, to check the harness")
	flag.StringVar(&cfg.binary, "binary", "bin/onehop", "the onehop binary (make build)")
	flag.IntVar(&cfg.rounds, "rounds", 5, "interleaved rounds (at least 5 for figures worth quoting)")
	flag.StringVar(&cfg.out, "out", "bench/results/latest.json", "where to write raw samples and the summary")
	flag.Parse()
	cfg.seconds, cfg.pings = 3, 50
	if *quick {
		cfg.rounds, cfg.seconds, cfg.pings = 1, 1, 20
	}
	if cfg.rounds < 1 {
		fmt.Fprintln(os.Stderr, "bench: -rounds must be at least 1")
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: needs root (builds labs of network namespaces)")
		os.Exit(2)
	}
	bin, err := filepath.Abs(cfg.binary)
	if err == nil {
		_, err = os.Stat(bin)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: onehop binary %s: %v (run make build)\n", cfg.binary, err)
		os.Exit(2)
	}
	cfg.binary = bin

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	err = run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func progress(format string, a ...any) { fmt.Fprintf(os.Stderr, format+"\n", a...) }

func run(ctx context.Context, cfg config) (err error) {
	cleanup(cfg, nil) // leftovers of an interrupted run
	var variants []*variant
	// Always, also on error and on ^C (ctx ends the round loop).
	defer func() { cleanup(cfg, variants) }()

	dir, err := os.MkdirTemp("", "onehop-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	for _, v := range []struct{ name, lab, datapath string }{
		{"onehop", "benchoh", "onehop"},
		{"bridge", "benchbr", "bridge"},
	} {
		progress("setup: lab %s (datapath %s)", v.lab, v.datapath)
		lv, err := labVariant(ctx, cfg, dir, v.name, v.lab, v.datapath)
		if err != nil {
			return err
		}
		variants = append(variants, lv)
	}
	progress("setup: raw veth pair %s <-> %s", vethA, vethB)
	vv, err := vethVariant()
	if err != nil {
		return err
	}
	variants = append(variants, vv)
	for _, v := range variants {
		if err := startServer(ctx, v); err != nil {
			return err
		}
	}

	samples := map[string]map[string][]float64{} // figure -> variant -> values
	for _, f := range figures {
		samples[f.Key] = map[string][]float64{}
	}
	for r := 0; r < cfg.rounds; r++ {
		for i := range variants {
			v := variants[(i+r)%len(variants)] // rotate who goes first
			for _, f := range figures {
				if ctx.Err() != nil {
					return errors.New("interrupted")
				}
				progress("round %d/%d: %s %s", r+1, cfg.rounds, v.Name, f.Key)
				val, err := measure(cfg, v, f.Key)
				if err != nil {
					return fmt.Errorf("round %d %s %s: %w", r+1, v.Name, f.Key, err)
				}
				samples[f.Key][v.Name] = append(samples[f.Key][v.Name], val)
			}
		}
	}
	return report(cfg, variants, samples)
}

func labVariant(ctx context.Context, cfg config, dir, name, lab, datapath string) (*variant, error) {
	topo := fmt.Sprintf(`name: %s
datapath: %s
hosts: [{name: h1}, {name: h2}]
farms:
  - name: bench
    subnets: [{name: net}]
vms:
  - {name: vm1, host: h1, subnet: bench/net}
  - {name: vm2, host: h2, subnet: bench/net}
`, lab, datapath)
	path := filepath.Join(dir, lab+".yaml")
	if err := os.WriteFile(path, []byte(topo), 0o600); err != nil {
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, cfg.binary, "lab", "up", path, "--root", labRoot).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("lab up %s: %v\n%s", lab, err, out)
	}
	out, err := exec.Command(cfg.binary, "lab", "status", "--root", labRoot, "--lab", lab, "-o", "json").Output()
	if err != nil {
		return nil, fmt.Errorf("lab status %s: %w", lab, err)
	}
	var st struct {
		Nodes []struct {
			Name       string
			Interfaces []struct {
				Name  string
				Addrs []string
			}
		}
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, err
	}
	dstIP := ""
	for _, n := range st.Nodes {
		if n.Name == "vm2" && len(n.Interfaces) > 0 && len(n.Interfaces[0].Addrs) > 0 {
			dstIP = strings.Split(n.Interfaces[0].Addrs[0], "/")[0]
		}
	}
	if dstIP == "" {
		return nil, fmt.Errorf("lab %s: no address for vm2 in lab status", lab)
	}
	in := func(node string) func(args ...string) *exec.Cmd {
		return func(args ...string) *exec.Cmd {
			return exec.Command(cfg.binary, append([]string{"lab", "exec", "--root", labRoot, "--lab", lab, node, "--"}, args...)...)
		}
	}
	return &variant{Name: name, src: in("vm1"), dst: in("vm2"), dstIP: dstIP}, nil
}

func vethVariant() (*variant, error) {
	steps := [][]string{
		{"netns", "add", vethA},
		{"netns", "add", vethB},
		{"link", "add", "bva", "netns", vethA, "type", "veth", "peer", "name", "bvb", "netns", vethB},
		{"-n", vethA, "addr", "add", "10.255.0.1/24", "dev", "bva"},
		{"-n", vethB, "addr", "add", vethDstIP + "/24", "dev", "bvb"},
		{"-n", vethA, "link", "set", "bva", "up"},
		{"-n", vethB, "link", "set", "bvb", "up"},
		{"-n", vethA, "link", "set", "lo", "up"},
		{"-n", vethB, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ip %s: %v\n%s", strings.Join(s, " "), err, out)
		}
	}
	in := func(ns string) func(args ...string) *exec.Cmd {
		return func(args ...string) *exec.Cmd {
			return exec.Command("nsenter", append([]string{"--net=/run/netns/" + ns, "--"}, args...)...)
		}
	}
	return &variant{Name: "veth", src: in(vethA), dst: in(vethB), dstIP: vethDstIP}, nil
}

// startServer runs one long-lived iperf3 server in the destination; it is a
// child of this process, so cleanup can kill it even after its namespace is
// gone (a daemonized one would outlive the namespace).
func startServer(ctx context.Context, v *variant) error {
	v.server = v.dst("iperf3", "-s")
	if err := v.server.Start(); err != nil {
		return fmt.Errorf("%s: iperf3 server: %w", v.Name, err)
	}
	for i := 0; i < 50; i++ {
		out, _ := v.dst("ss", "-ltn", "sport = :5201").Output()
		if strings.Contains(string(out), "5201") {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s: iperf3 server not listening after 5s", v.Name)
}

func measure(cfg config, v *variant, key string) (float64, error) {
	secs := fmt.Sprint(cfg.seconds)
	switch key {
	case "tcp":
		// bbr (the default here) is very slow between namespaces on this
		// machine; cubic per socket is what a tuned guest would run.
		out, err := v.src("iperf3", "-c", v.dstIP, "-t", secs, "-C", "cubic", "-J").Output()
		if err != nil && len(out) == 0 {
			return 0, err
		}
		return iperfTCP(out)
	case "udp64":
		out, err := v.src("iperf3", "-c", v.dstIP, "-u", "-l", "64", "-b", "0", "-t", secs, "-J").Output()
		if err != nil && len(out) == 0 {
			return 0, err
		}
		return iperfUDPReceivedPPS(out)
	case "rtt":
		// Warm the neighbour caches first so no ARP is in the figure.
		v.src("ping", "-c", "2", "-i", "0.01", "-q", v.dstIP).Run()
		out, err := v.src("ping", "-c", fmt.Sprint(cfg.pings), "-i", "0.01", "-q", v.dstIP).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("%v: %s", err, out)
		}
		return pingAvgMicros(out)
	}
	return 0, fmt.Errorf("unknown figure %s", key)
}

// Result is what the JSON report holds.
type Result struct {
	Time    time.Time                         `json:"time"`
	Rounds  int                               `json:"rounds"`
	Seconds int                               `json:"secondsPerTest"`
	Samples map[string]map[string][]float64   `json:"samples"`
	Summary map[string]map[string]Summary     `json:"summary"`
	Ratios  map[string]map[string]float64     `json:"onehopRatioOfMedians"`
	Targets map[string]map[string]interface{} `json:"targets"`
}

func report(cfg config, variants []*variant, samples map[string]map[string][]float64) error {
	res := Result{Time: time.Now().UTC(), Rounds: cfg.rounds, Seconds: cfg.seconds, Samples: samples,
		Summary: map[string]map[string]Summary{}, Ratios: map[string]map[string]float64{}, Targets: map[string]map[string]interface{}{}}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Printf("\nonehop vs baselines, VM to VM across two hosts; %d interleaved rounds, %ds per test\n\n", cfg.rounds, cfg.seconds)
	fmt.Fprintln(w, "figure\tvariant\tmin\tmedian\tmax\tonehop / this\ttarget vs bridge\t")
	for _, f := range figures {
		res.Summary[f.Key] = map[string]Summary{}
		res.Ratios[f.Key] = map[string]float64{}
		oh := Summarize(samples[f.Key]["onehop"])
		for _, v := range variants {
			s := Summarize(samples[f.Key][v.Name])
			res.Summary[f.Key][v.Name] = s
			ratio, verdict := "", ""
			if v.Name != "onehop" {
				r := Ratio(oh.Median, s.Median)
				res.Ratios[f.Key][v.Name] = r
				ratio = fmt.Sprintf("%.2fx", r)
				if v.Name == "bridge" {
					ok := r >= target[f.Key]
					cmp := ">="
					if f.LowerBetter {
						ok, cmp = r <= target[f.Key], "<="
					}
					verdict = fmt.Sprintf("%s %.2fx: %s", cmp, target[f.Key], map[bool]string{true: "PASS", false: "MISS"}[ok])
					res.Targets[f.Key] = map[string]interface{}{"want": cmp + fmt.Sprint(target[f.Key]), "ratio": r, "met": ok}
				}
			}
			fmt.Fprintf(w, "%s (%s)\t%s\t%.2f\t%.2f\t%.2f\t%s\t%s\t\n", f.Title, f.Unit, v.Name,
				s.Min/f.Scale, s.Median/f.Scale, s.Max/f.Scale, ratio, verdict)
		}
	}
	w.Flush()
	fmt.Println("\n(ratios are of medians; for RTT lower is better, so onehop/bridge <= 1.05 is the goal)")
	if err := os.MkdirAll(filepath.Dir(cfg.out), 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	if err := os.WriteFile(cfg.out, b, 0o644); err != nil {
		return err
	}
	fmt.Printf("raw samples and summary: %s\n", cfg.out)
	return nil
}

// cleanup removes everything the bench makes; safe to run when nothing is there.
func cleanup(cfg config, variants []*variant) {
	for _, v := range variants {
		if v.server != nil && v.server.Process != nil {
			v.server.Process.Kill()
			v.server.Wait()
		}
	}
	for _, lab := range []string{"benchoh", "benchbr"} {
		exec.Command(cfg.binary, "lab", "down", "--root", labRoot, "--lab", lab).Run()
	}
	for _, ns := range []string{vethA, vethB} {
		exec.Command("ip", "netns", "del", ns).Run()
	}
}
