// Command bench measures onehop against its baselines in one run, side by
// side:
//
//   - onehop:   vm1 -> vm2, one subnet, across two hosts of a lab with
//     onehop's eBPF datapath;
//   - routed:   vm1 -> vm3, from one subnet to another (one-hop routing), in
//     the same lab; routed-2: vm1 -> vm3 and vm4 -> vm5 at once;
//   - bridge:   vm1 -> vm2 in the same lab built with `datapath: bridge`, a
//     Linux bridge per host and no virtualization (the physical reference);
//   - router:   vm1 -> vm3 in that bridge lab, through a routing namespace on
//     the fabric that is both subnets' gateway (the paper's "routing VM");
//     router-2: vm1 -> vm3 and vm4 -> vm5 at once;
//   - veth:     one raw veth pair between two namespaces (the floor).
//
// Per variant and round it takes single-stream TCP throughput (iperf3, cubic),
// ping RTT, and the rate of 64-byte UDP datagrams received (two-pair variants:
// both pairs at once, rates summed, RTTs averaged). Variants are interleaved
// inside every round, in rotated order, so drift and noise on the machine hit
// them alike; the report gives min/median/max per figure and the ratio of
// medians for each comparison the issues set a target for.
//
//	go run ./bench -binary bin/onehop -rounds 5 -out bench/results/latest.json
//	go run ./bench -binary bin/onehop -quick -out /tmp/bench-quick.json
//
// It needs root. Everything it creates (two labs under -root, the veth and
// router namespaces, iperf3 servers) is removed at the end, on error and on
// ^C, and leftovers of an interrupted earlier run are removed before it
// starts.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Names of what the bench creates; fixed, so that a later run finds and
// removes what an interrupted one left behind.
const (
	defaultRoot = "/run/onehop-bench" // lab state root of the bench's own labs
	labOnehop   = "benchoh"
	labBridge   = "benchbr"
	vethNSA     = "ohbench-a"
	vethNSB     = "ohbench-b"
	vethIfA     = "ohb-a"
	vethIfB     = "ohb-b"
	vethSrcIP   = "10.255.0.1"
	vethDstIP   = "10.255.0.2"
	srcVM       = "vm1" // on h1
	dstVM       = "vm2" // on h2: the traffic crosses the fabric
	routedVM    = "vm3" // on h2, in the other subnet
	srcVM2      = "vm4" // on h1: the second pair's sender
	routedVM2   = "vm5" // on h2, in the other subnet
	routerNS    = "ohbench-rt"
	iperfPort   = "5201"
	udpLen      = 64
	pingGap     = "0.0005" // seconds between echoes (below 0.2 needs root); short, so idle-CPU wake-ups weigh less
)

// figure is one measured quantity. Values are kept in base units (bit/s,
// datagrams/s, µs) and divided by scale for printing.
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
	{key: "rtt", title: "ping RTT, avg", baseUnit: "µs", unit: "µs", scale: 1, digits: 1, lowerIsBetter: true},
	{key: "udp64", title: "UDP 64 B received", baseUnit: "datagrams/s", unit: "kpps", scale: 1e3, digits: 1},
}

// comparison is a ratio of medians the report gives: subject over baseline
// for one figure, with the target when there is one.
type comparison struct {
	subject, baseline, figure string
	target                    float64 // 0: informational
	strict                    bool    // the ratio must beat the target, not only reach it
}

// The comparisons, in the order the report lists them. RTT ratios are
// subject/baseline too, so there the target is an upper bound.
var comparisons = []comparison{
	// Issue 2: onehop is no slower than the physical reference.
	{"onehop", "bridge", "tcp", 1.0, false},
	{"onehop", "bridge", "rtt", 1.05, false},
	{"onehop", "bridge", "udp64", 1.0, false},
	{"onehop", "veth", "tcp", 0, false},
	{"onehop", "veth", "rtt", 0, false},
	{"onehop", "veth", "udp64", 0, false},
	// Issue 3: crossing subnets costs (almost) nothing: >= 0.97x on every
	// figure, which for RTT is <= 1/0.97.
	{"routed", "onehop", "tcp", 0.97, false},
	{"routed", "onehop", "rtt", 1 / 0.97, false},
	{"routed", "onehop", "udp64", 0.97, false},
	// Issue 3: against a routing namespace, lower RTT, and >= 1.2x the
	// small-packet rate with two pairs.
	{"routed", "router", "tcp", 0, false},
	{"routed", "router", "rtt", 1.0, true},
	{"routed", "router", "udp64", 0, false},
	{"routed-2", "router-2", "tcp", 0, false},
	{"routed-2", "router-2", "rtt", 1.0, true},
	{"routed-2", "router-2", "udp64", 1.2, false},
}

type config struct {
	binary  string
	root    string
	out     string
	rounds  int
	seconds int
	pings   int
	quick   bool
}

// errInterrupted is the cause of the run's context when a signal stopped it.
var errInterrupted = errors.New("interrupted")

func main() {
	var cfg config
	flag.StringVar(&cfg.binary, "binary", "bin/onehop", "the onehop binary (`make build`)")
	flag.StringVar(&cfg.root, "root", defaultRoot, "state root for the bench's labs (kept apart from other labs)")
	flag.StringVar(&cfg.out, "out", "bench/results/latest.json", "where to write raw samples and the summary (JSON)")
	flag.IntVar(&cfg.rounds, "rounds", 5, "interleaved rounds; at least 5 for figures worth quoting")
	flag.IntVar(&cfg.seconds, "seconds", 3, "duration of each iperf3 test")
	flag.IntVar(&cfg.pings, "pings", 1000, "echoes per RTT sample")
	flag.BoolVar(&cfg.quick, "quick", false, "1 round of 1-second tests, to check the harness (an explicit -rounds/-seconds still wins)")
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
	if err := checkSetup(&cfg); err != nil {
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

	err := run(ctx, cfg)
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

// VariantInfo describes a variant in the report.
type VariantInfo struct {
	Name        string   `json:"name"`
	Description string   `json:"description"`
	DstIPs      []string `json:"dstIPs"` // one per pair
}

// pair is one sender and one receiver.
type pair struct {
	dstIP string
	// src and dst build a command running inside the sending and the
	// receiving namespace.
	src, dst func(ctx context.Context, argv ...string) *exec.Cmd
	server   string // the receiver's iperf3 server, a key of bench.servers
}

// variant is one way of carrying traffic: its pairs run at once.
type variant struct {
	VariantInfo
	pairs []*pair
}

func newVariant(name, desc string, pairs ...*pair) *variant {
	v := &variant{VariantInfo: VariantInfo{Name: name, Description: desc}, pairs: pairs}
	for _, p := range pairs {
		v.DstIPs = append(v.DstIPs, p.dstIP)
	}
	return v
}

// server is a long-lived iperf3 server, a child of the bench.
type server struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when it has exited
	err  error         // how it exited; read after done
}

func (s *server) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// stop ends the server: SIGTERM, then SIGKILL if it lingers.
func (s *server) stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(3 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
}

// bench holds what one run has made, so cleanup knows what to undo.
type bench struct {
	cfg      config
	tmp      string
	variants []*variant
	mu       sync.Mutex         // guards servers: pairs of a variant run at once
	servers  map[string]*server // by receiver ("lab/node" or namespace)
}

// command returns a command for argv that ends with ctx (SIGTERM first,
// so that `lab up` can undo itself and iperf3 can say goodbye to its peer,
// SIGKILL 5 s later). Each child gets its own process group, so a terminal's
// ^C reaches only the bench, which then stops things in order; and it dies
// with the bench (Pdeathsig), so even a SIGKILLed bench leaves no iperf3
// running inside a namespace it can no longer find.
func command(ctx context.Context, argv ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// output runs cmd and returns its stdout; a failure carries its stderr.
func output(cmd *exec.Cmd) ([]byte, error) {
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(string(out))
		}
		return out, fmt.Errorf("%s: %v: %s", strings.Join(cmd.Args, " "), err, msg)
	}
	return out, nil
}

func (b *bench) onehop(ctx context.Context, args ...string) *exec.Cmd {
	return command(ctx, append([]string{b.cfg.binary}, args...)...)
}

// inLab runs commands inside a node of a lab, as a user would.
func (b *bench) inLab(lab, node string) func(context.Context, ...string) *exec.Cmd {
	return func(ctx context.Context, argv ...string) *exec.Cmd {
		return b.onehop(ctx, append([]string{"lab", "exec", "--root", b.cfg.root, "--lab", lab, node, "--"}, argv...)...)
	}
}

func inNetns(ns string) func(context.Context, ...string) *exec.Cmd {
	return func(ctx context.Context, argv ...string) *exec.Cmd {
		return command(ctx, append([]string{"ip", "netns", "exec", ns}, argv...)...)
	}
}

func run(ctx context.Context, cfg config) (err error) {
	if err := os.MkdirAll(cfg.root, 0o700); err != nil {
		return err
	}
	unlock, err := lockRoot(cfg.root)
	if err != nil {
		return err
	}
	defer unlock()

	b := &bench{cfg: cfg, servers: map[string]*server{}}
	if b.tmp, err = os.MkdirTemp("", "onehop-bench-"); err != nil {
		return err
	}
	defer os.RemoveAll(b.tmp) // after cleanup (defers run last-in first-out): it holds the server logs
	if left := b.leftovers(); len(left) > 0 {
		progress("setup: removing leftovers of an earlier run: %s", strings.Join(left, " "))
		if err := b.cleanup(); err != nil {
			return fmt.Errorf("leftovers of an earlier run: %w", err)
		}
	}
	// From here on, whatever happens, everything goes again.
	defer func() {
		progress("cleanup: iperf3 servers, labs %s and %s, namespaces %s", labOnehop, labBridge, strings.Join(benchNetns, " "))
		if cerr := b.cleanup(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", cerr))
		}
	}()
	stopped := func(err error) error {
		if context.Cause(ctx) == errInterrupted {
			return errInterrupted
		}
		return err
	}

	rep := newReport(cfg)
	if err := b.setup(ctx); err != nil {
		return stopped(err)
	}
	for _, v := range b.variants {
		rep.Variants = append(rep.Variants, v.VariantInfo)
	}
	rep.Started = time.Now().UTC()
	for r := 0; r < cfg.rounds; r++ {
		for slot, i := range Rotation(len(b.variants), r) {
			v := b.variants[i]
			for _, f := range figures {
				if ctx.Err() != nil {
					return stopped(ctx.Err())
				}
				m, retried, err := b.measure(ctx, v, f, cfg.seconds)
				if err != nil {
					return stopped(fmt.Errorf("round %d %s %s: %w", r+1, v.Name, f.key, err))
				}
				rep.add(Sample{Round: r + 1, Slot: slot + 1, Variant: v.Name, Figure: f.key, Value: m.Value,
					Unit: f.baseUnit, Extra: m.Extra, Retried: retried, At: time.Now().UTC(), Load1: load1()})
				note := ""
				if lost := m.Extra["lost"]; f.key == "rtt" && lost > 0 {
					note = fmt.Sprintf(" (%v of %v echoes lost)", lost, m.Extra["sent"])
				}
				progress("round %d/%d: %-6s %-5s %*.*f %s%s", r+1, cfg.rounds, v.Name, f.key,
					8, f.digits, m.Value/f.scale, f.unit, note)
			}
		}
	}
	rep.Finished = time.Now().UTC()
	rep.summarize()
	rep.print(os.Stdout)
	if err := rep.write(cfg.out); err != nil {
		return err
	}
	fmt.Printf("\nraw samples and summary: %s\n", cfg.out)
	return nil
}

// lockRoot keeps a second bench run off the same names: it would take this
// run's labs for leftovers and tear them down mid-measurement.
func lockRoot(root string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(root, ".bench.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another bench run holds %s (%v); wait for it to finish", f.Name(), err)
	}
	return func() { f.Close() }, nil
}

// setup builds the variants and starts an iperf3 server in each receiver,
// then warms each path up.
func (b *bench) setup(ctx context.Context) error {
	progress("setup: lab %s (datapath onehop: subnets net and net2, net may reach net2)", labOnehop)
	oh, err := b.labUp(ctx, labOnehop, "onehop", `farms:
  - name: bench
    subnets: [{name: net}, {name: net2}]
    rules: [{from: net, to: net2}]
vms:
  - {name: vm1, host: h1, subnet: bench/net}
  - {name: vm2, host: h2, subnet: bench/net}
  - {name: vm3, host: h2, subnet: bench/net2}
  - {name: vm4, host: h1, subnet: bench/net}
  - {name: vm5, host: h2, subnet: bench/net2}
`)
	if err != nil {
		return err
	}
	progress("setup: lab %s (datapath bridge: no virtualization; the same VMs on the same hosts)", labBridge)
	br, err := b.labUp(ctx, labBridge, "bridge", `farms:
  - name: bench
    subnets: [{name: net}, {name: net2}]
vms:
  - {name: vm1, host: h1, subnet: bench/net}
  - {name: vm2, host: h2, subnet: bench/net}
  - {name: vm3, host: h2, subnet: bench/net2}
  - {name: vm4, host: h1, subnet: bench/net}
  - {name: vm5, host: h2, subnet: bench/net2}
`)
	if err != nil {
		return err
	}
	intra, err1 := oh.pair(srcVM, dstVM)
	routed, err2 := oh.pair(srcVM, routedVM)
	routed2, err3 := oh.pair(srcVM2, routedVM2)
	physical, err4 := br.pair(srcVM, dstVM)
	viaRouter, err5 := br.pair(srcVM, routedVM)
	viaRouter2, err6 := br.pair(srcVM2, routedVM2)
	if err := errors.Join(err1, err2, err3, err4, err5, err6); err != nil {
		return err
	}
	progress("setup: veth pair %s (%s) <-> %s (%s)", vethNSA, vethSrcIP, vethNSB, vethDstIP)
	veth, err := b.vethPair(ctx)
	if err != nil {
		return err
	}
	progress("setup: routing namespace %s on lab %s's fabric, the gateway of both subnets", routerNS, labBridge)
	if err := b.router(ctx, br); err != nil {
		return err
	}
	b.variants = []*variant{
		newVariant("onehop", "lab "+labOnehop+": vm1 on h1 -> vm2 on h2, one subnet, through onehop's eBPF datapath", intra),
		newVariant("routed", "lab "+labOnehop+": vm1 (net) on h1 -> vm3 (net2) on h2: one-hop routing between subnets", routed),
		newVariant("routed-2", "lab "+labOnehop+": vm1 -> vm3 and vm4 -> vm5 at once, h1 (net) to h2 (net2)", routed, routed2),
		newVariant("router", "lab "+labBridge+": vm1 (net) on h1 -> vm3 (net2) on h2 through routing namespace "+routerNS+" on the fabric", viaRouter),
		newVariant("router-2", "lab "+labBridge+": vm1 -> vm3 and vm4 -> vm5 at once through "+routerNS, viaRouter, viaRouter2),
		newVariant("bridge", "lab "+labBridge+": vm1 on h1 -> vm2 on h2 through a Linux bridge per host (no virtualization)", physical),
		newVariant("veth", fmt.Sprintf("namespaces %s -> %s joined by one veth pair", vethNSA, vethNSB), veth),
	}

	for _, v := range b.variants {
		for _, p := range v.pairs {
			// A path that does not carry a ping is a broken setup, not a
			// figure. (It also lets onehop's ARP engine learn the path.)
			if _, err := output(p.src(ctx, "ping", "-c", "3", "-i", "0.2", "-W", "2", p.dstIP)); err != nil {
				return fmt.Errorf("%s: the source cannot reach %s: %w", v.Name, p.dstIP, err)
			}
			if err := b.startServer(ctx, p); err != nil {
				return err
			}
		}
		// One unrecorded TCP run: the first transfer on a fresh path pays for
		// neighbour resolution, page faults and cold caches.
		progress("setup: %s warm-up (1 s of TCP, not recorded)", v.Name)
		if _, _, err := b.measure(ctx, v, figure{key: "tcp"}, 1); err != nil {
			return fmt.Errorf("%s warm-up: %w", v.Name, err)
		}
	}
	return nil
}

// labHandle is a lab the bench brought up.
type labHandle struct {
	b      *bench
	name   string
	status []byte // `lab status -o json`
}

// labUp brings up a two-host lab (h1, h2) with the given datapath, farms and VMs.
func (b *bench) labUp(ctx context.Context, lab, datapath, farmsAndVMs string) (*labHandle, error) {
	topo := fmt.Sprintf("# written by bench/main.go\nname: %s\ndatapath: %s\nhosts:\n  - name: h1\n  - name: h2\n%s",
		lab, datapath, farmsAndVMs)
	path := filepath.Join(b.tmp, lab+".yaml")
	if err := os.WriteFile(path, []byte(topo), 0o600); err != nil {
		return nil, err
	}
	start := time.Now()
	if out, err := b.onehop(ctx, "lab", "up", path, "--root", b.cfg.root).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("lab up %s: %v\n%s", lab, err, out)
	}
	progress("setup: lab %s is up in %.1fs", lab, time.Since(start).Seconds())
	status, err := output(b.onehop(ctx, "lab", "status", "--root", b.cfg.root, "--lab", lab, "-o", "json"))
	if err != nil {
		return nil, err
	}
	return &labHandle{b: b, name: lab, status: status}, nil
}

// pair is from -> to inside the lab; to's address comes from `lab status`.
func (l *labHandle) pair(from, to string) (*pair, error) {
	ip, err := VMAddress(l.status, to)
	if err != nil {
		return nil, fmt.Errorf("lab %s: %w", l.name, err)
	}
	return &pair{dstIP: ip, src: l.b.inLab(l.name, from), dst: l.b.inLab(l.name, to), server: l.name + "/" + to}, nil
}

// newNetns makes a namespace like a lab's: IPv4 only (no IPv6
// autoconfiguration traffic in the way), loopback up.
func newNetns(ctx context.Context, ns string) error {
	for _, s := range [][]string{
		{"netns", "add", ns},
		{"netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"},
		{"-n", ns, "link", "set", "lo", "up"},
	} {
		if _, err := output(command(ctx, append([]string{"ip"}, s...)...)); err != nil {
			return err
		}
	}
	return nil
}

func ipSteps(ctx context.Context, steps [][]string) error {
	for _, s := range steps {
		if _, err := output(command(ctx, append([]string{"ip"}, s...)...)); err != nil {
			return err
		}
	}
	return nil
}

// vethPair makes two namespaces joined by one veth pair.
func (b *bench) vethPair(ctx context.Context) (*pair, error) {
	for _, ns := range []string{vethNSA, vethNSB} {
		if err := newNetns(ctx, ns); err != nil {
			return nil, err
		}
	}
	err := ipSteps(ctx, [][]string{
		{"link", "add", vethIfA, "netns", vethNSA, "type", "veth", "peer", "name", vethIfB, "netns", vethNSB},
		{"-n", vethNSA, "addr", "add", vethSrcIP + "/24", "dev", vethIfA},
		{"-n", vethNSB, "addr", "add", vethDstIP + "/24", "dev", vethIfB},
		{"-n", vethNSA, "link", "set", vethIfA, "up"},
		{"-n", vethNSB, "link", "set", vethIfB, "up"},
	})
	if err != nil {
		return nil, err
	}
	return &pair{dstIP: vethDstIP, src: inNetns(vethNSA), dst: inNetns(vethNSB), server: vethNSB}, nil
}

// router makes the routing baseline, the paper's "routing VM" as a
// namespace: in the bridge lab (the same hosts, fabric and VM placement as
// onehop's lab), the two subnets share the fabric's L2, and routing
// namespace routerNS sits on the fabric with one leg in each subnet as its
// gateway (10.f.s.1, the address every VM already routes through). Traffic
// between subnets goes VM -> its host's bridge -> fabric -> router ->
// fabric -> the other host's bridge -> VM, as through a routing VM.
func (b *bench) router(ctx context.Context, l *labHandle) error {
	if err := newNetns(ctx, routerNS); err != nil {
		return err
	}
	fabricNS := "oh-" + l.name + "-fabric"
	steps := [][]string{
		{"netns", "exec", routerNS, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1",
			// Both legs share one L2: each answers ARP for its own address only.
			"net.ipv4.conf.all.arp_ignore=1", "net.ipv4.conf.all.send_redirects=0"},
	}
	var gateways []string
	for _, vm := range []string{srcVM, routedVM} {
		ip, err := VMAddress(l.status, vm)
		if err != nil {
			return err
		}
		gateways = append(gateways, ip[:strings.LastIndexByte(ip, '.')]+".1/24")
	}
	for i, gw := range gateways {
		leg, port := fmt.Sprintf("leg%d", i+1), fmt.Sprintf("rt-leg%d", i+1)
		steps = append(steps,
			[]string{"link", "add", leg, "netns", routerNS, "type", "veth", "peer", "name", port, "netns", fabricNS},
			[]string{"-n", fabricNS, "link", "set", port, "master", "br0", "up"},
			[]string{"-n", routerNS, "addr", "add", gw, "dev", leg},
			[]string{"-n", routerNS, "link", "set", leg, "up"})
	}
	return ipSteps(ctx, steps)
}

// startServer runs one iperf3 server in p's receiver for the whole run (one
// per receiver, shared by the variants that use it) and waits until it
// listens. It is a child of the bench (not `iperf3 -D`), so cleanup can stop
// it by pid even once its namespace is gone.
func (b *bench) startServer(ctx context.Context, p *pair) error {
	b.mu.Lock()
	if s, ok := b.servers[p.server]; ok && !s.exited() {
		b.mu.Unlock()
		return nil
	}
	b.mu.Unlock()
	logf, err := os.CreateTemp(b.tmp, "iperf3-server-"+strings.ReplaceAll(p.server, "/", "-")+"-*.log")
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	// Not bound to ctx: cleanup stops it, after the clients.
	s := &server{cmd: p.dst(context.Background(), "iperf3", "-s", "-p", iperfPort), log: logf.Name(), done: make(chan struct{})}
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("%s: iperf3 server: %w", p.server, err)
	}
	b.mu.Lock()
	b.servers[p.server] = s
	b.mu.Unlock()
	go func() { s.err = s.cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _ := p.dst(ctx, "ss", "-Hltn", "sport = :"+iperfPort).Output()
		if len(bytes.TrimSpace(out)) > 0 {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("%s: iperf3 server exited (%v): %s", p.server, s.err, tailFile(s.log))
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: iperf3 server not listening on %s after 10s: %s", p.server, iperfPort, tailFile(s.log))
		}
	}
}

func (b *bench) serverOf(p *pair) *server {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.servers[p.server]
}

// measure takes one sample of figure f on v: its pairs at once, rates
// summed and RTTs averaged (Combine).
func (b *bench) measure(ctx context.Context, v *variant, f figure, secs int) (Measurement, bool, error) {
	ms := make([]Measurement, len(v.pairs))
	retried := make([]bool, len(v.pairs))
	errs := make([]error, len(v.pairs))
	var wg sync.WaitGroup
	for i, p := range v.pairs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ms[i], retried[i], errs[i] = b.measurePair(ctx, v.Name, p, f, secs)
		}()
	}
	wg.Wait()
	any := false
	for _, r := range retried {
		any = any || r
	}
	if err := errors.Join(errs...); err != nil {
		return Measurement{}, any, err
	}
	return Combine(f.key, ms), any, nil
}

// measurePair takes one sample of figure f on one pair, with iperf3 tests of
// secs seconds. A failed run is tried once more, after restarting the pair's
// iperf3 server if it has gone (on a shared machine, something may kill
// iperf3 by name); a second failure ends the bench. retried says whether it
// took two.
func (b *bench) measurePair(ctx context.Context, variant string, p *pair, f figure, secs int) (m Measurement, retried bool, err error) {
	var argv []string
	var parse func([]byte) (Measurement, error)
	switch f.key {
	case "tcp":
		// bbr, this kernel's default, is slow between namespaces here; cubic
		// is set per socket (a namespace may not change its default).
		argv = []string{"iperf3", "-c", p.dstIP, "-p", iperfPort, "-t", strconv.Itoa(secs), "-C", "cubic", "-J"}
		parse = ParseIperfTCP
	case "udp64":
		// -b 0: as fast as the sender can; the figure is what arrives.
		argv = []string{"iperf3", "-c", p.dstIP, "-p", iperfPort, "-u", "-l", strconv.Itoa(udpLen), "-b", "0", "-t", strconv.Itoa(secs), "-J"}
		parse = func(out []byte) (Measurement, error) { return ParseIperfUDP(out, udpLen) }
	case "rtt":
		argv = []string{"ping", "-c", strconv.Itoa(b.cfg.pings), "-i", pingGap, p.dstIP}
		parse = ParsePing
	default:
		return Measurement{}, false, fmt.Errorf("unknown figure %q", f.key)
	}
	for attempt := 0; ; attempt++ {
		// A test that outlives its length by this much is hung, not slow.
		tctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+30*time.Second)
		out, runErr := output(p.src(tctx, argv...))
		cancel()
		if ctx.Err() != nil {
			return Measurement{}, attempt > 0, context.Cause(ctx)
		}
		m, err = parse(out)
		switch {
		case err == nil && runErr == nil:
			return m, attempt > 0, nil
		case err == nil:
			err = runErr
		case runErr != nil && f.key == "rtt":
			err = runErr // ping's own message says more than "no summary"
		}
		if s := b.serverOf(p); f.key != "rtt" && s != nil && s.exited() {
			err = fmt.Errorf("%w (the iperf3 server had exited: %v: %s)", err, s.err, tailFile(s.log))
		}
		if attempt == 1 {
			return Measurement{}, true, err
		}
		progress("  %s %s -> %s failed: %v; retrying once", variant, f.key, p.dstIP, err)
		select {
		case <-ctx.Done():
			return Measurement{}, true, context.Cause(ctx)
		case <-time.After(time.Second):
		}
		if s := b.serverOf(p); f.key != "rtt" && s != nil && s.exited() {
			if err := b.startServer(ctx, p); err != nil {
				return Measurement{}, true, err
			}
		}
	}
}

// leftovers lists what exists of the bench's names: lab namespaces or state
// and the veth namespaces.
func (b *bench) leftovers() []string {
	var out []string
	for _, lab := range []string{labOnehop, labBridge} {
		if _, err := os.Stat(filepath.Join(b.cfg.root, lab)); err == nil {
			out = append(out, "lab "+lab)
		}
	}
	return append(out, ourNetns()...)
}

// benchNetns are the namespaces the bench makes itself (the labs make theirs).
var benchNetns = []string{vethNSA, vethNSB, routerNS}

// ourNetns lists the named namespaces whose names the bench uses.
func ourNetns() []string {
	entries, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, "oh-"+labOnehop+"-") || strings.HasPrefix(n, "oh-"+labBridge+"-") || slices.Contains(benchNetns, n) {
			out = append(out, n)
		}
	}
	return out
}

// cleanup removes everything the bench makes, whether this run made it or an
// interrupted earlier one did; it is safe when nothing is there, keeps going
// past errors, and fails only if something is still there afterwards.
func (b *bench) cleanup() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	// 1. Our iperf3 servers, by pid.
	b.mu.Lock()
	for key, s := range b.servers {
		s.stop()
		delete(b.servers, key)
	}
	b.mu.Unlock()
	// 2. Tools still running in the VMs' and veth namespaces: only those an
	// earlier bench run left there (this run's are gone by now).
	killStrays(ctx)
	// 3. The labs: `lab down` stops their daemons and removes namespaces,
	// pins and state; it also cleans namespaces a crashed `lab up` left
	// without state. A lab that is not there at all is not an error.
	for _, lab := range []string{labOnehop, labBridge} {
		_, stateErr := os.Stat(filepath.Join(b.cfg.root, lab))
		if stateErr != nil && !hasNetns("oh-"+lab+"-") {
			continue
		}
		if out, err := b.onehop(ctx, "lab", "down", "--root", b.cfg.root, "--lab", lab).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("lab down %s: %v\n%s", lab, err, out))
		}
	}
	// 4. The bench's own namespaces (their veths and bridges go with them).
	for _, ns := range benchNetns {
		if _, err := os.Stat(filepath.Join("/run/netns", ns)); err != nil {
			continue
		}
		if _, err := output(command(ctx, "ip", "netns", "del", ns)); err != nil {
			errs = append(errs, err)
		}
	}
	if left := b.leftovers(); len(left) > 0 {
		errs = append(errs, fmt.Errorf("still there after cleanup: %s", strings.Join(left, " ")))
	}
	return errors.Join(errs...)
}

func hasNetns(prefix string) bool {
	for _, n := range ourNetns() {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return false
}

// killStrays kills iperf3 and ping processes inside the bench's VM and veth
// namespaces, by pid. A bench killed hard leaves its iperf3 servers there
// only if Pdeathsig failed; they would keep the namespaces alive.
func killStrays(ctx context.Context) {
	for _, ns := range ourNetns() {
		if strings.HasSuffix(ns, "-h1") || strings.HasSuffix(ns, "-h2") || strings.HasSuffix(ns, "-fabric") || strings.HasSuffix(ns, "-controller") {
			continue // hosts run the lab's daemons: `lab down` stops those
		}
		out, err := command(ctx, "ip", "netns", "pids", ns).Output()
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(out)) {
			pid, err := strconv.Atoi(f)
			if err != nil || pid <= 1 || pid == os.Getpid() {
				continue
			}
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			if c := strings.TrimSpace(string(comm)); c == "iperf3" || c == "ping" {
				progress("cleanup: killing leftover %s (pid %d) in %s", c, pid, ns)
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// tailFile returns the last lines of a log, on one line, for an error.
func tailFile(path string) string {
	b, _ := os.ReadFile(path)
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return "(no output)"
	}
	return strings.Join(lines[max(0, len(lines)-3):], " | ")
}

// load1 returns the 1-minute load average; recorded with each sample so a
// noisy run can be recognized afterwards.
func load1() float64 {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
