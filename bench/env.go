package main

// The environment scenarios build on: labs, namespaces of the bench's own,
// fixtures shared by several scenarios, the iperf3 servers and the cgroup
// of the bench's tools; and the cleanup that removes all of it, whether
// this run made it or an interrupted earlier one did.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/netns"
)

// Names of what the bench creates; fixed, so that a later run finds and
// removes what an interrupted one left behind.
const (
	defaultRoot = "/run/onehop-bench" // lab state root of the bench's own labs
	netnsPrefix = "ohbench-"          // every namespace the bench makes itself
	labMarker   = ".bench-lab-"       // <root>/.bench-lab-NAME: lab NAME is the bench's (set before `lab up`)
	cgroupName  = "onehop-bench"      // the tools' cgroup, at the root of the cgroup v2 hierarchy
	iperfPort   = "5201"
)

// Env is what one run has made, so that scenarios can share it and cleanup
// knows what to undo. Scenarios are built one at a time; pairs of one
// scenario run at once, so only the servers are locked.
type Env struct {
	cfg     config
	tmp     string           // topology files, server logs
	labs    map[string]*Lab  // by name
	once    map[string]error // fixtures built, by key, with how it went
	cgroup  string           // the tools' cgroup directory; "" without cgroup v2
	cgfd    int              // open descriptor of cgroup, for CLONE_INTO_CGROUP; -1 without
	cpu     *cpuMeter
	mu      sync.Mutex         // guards servers
	servers map[string]*server // by receiver (Pair.Server; rrperf's: rrServerKey)
	// closers undo what scenarios hold in the bench's own process (loaded
	// eBPF programs, say), last first, before the namespaces go.
	closers []func() error
}

// OnCleanup registers fn to run at cleanup, before namespaces are removed.
func (e *Env) OnCleanup(fn func() error) { e.closers = append(e.closers, fn) }

func newEnv(cfg config) (*Env, error) {
	e := &Env{cfg: cfg, labs: map[string]*Lab{}, once: map[string]error{}, servers: map[string]*server{}, cgfd: -1}
	var err error
	if e.tmp, err = os.MkdirTemp("", "onehop-bench-"); err != nil {
		return nil, err
	}
	return e, nil
}

// close releases what cleanup does not remove: the temporary directory
// (after cleanup: it holds the server logs) and the cgroup's descriptor.
func (e *Env) close() {
	if e.cgfd >= 0 {
		syscall.Close(e.cgfd)
		e.cgfd = -1
	}
	os.RemoveAll(e.tmp)
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
		return out, cmdError(cmd, err, out, stderr.Bytes())
	}
	return out, nil
}

func cmdError(cmd *exec.Cmd, err error, stdout, stderr []byte) error {
	msg := strings.TrimSpace(string(stderr))
	if msg == "" {
		msg = strings.TrimSpace(string(stdout))
	}
	return fmt.Errorf("%s: %v: %s", strings.Join(cmd.Args, " "), err, msg)
}

func (e *Env) onehop(ctx context.Context, args ...string) *exec.Cmd {
	return command(ctx, append([]string{e.cfg.binary}, args...)...)
}

// tool marks cmd as one of the bench's measuring tools (iperf3, ping): it
// starts inside the tools' cgroup, whose CPU time is recorded and whose
// processes cleanup kills wholesale.
func (e *Env) tool(cmd *exec.Cmd) *exec.Cmd {
	if e.cgfd >= 0 {
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = e.cgfd
	}
	return cmd
}

// Cmd builds a command running argv inside one node or namespace.
type Cmd func(ctx context.Context, argv ...string) *exec.Cmd

// inLab runs commands inside a node of a lab, as a user would.
func (e *Env) inLab(lab, node string) Cmd {
	return func(ctx context.Context, argv ...string) *exec.Cmd {
		return e.onehop(ctx, append([]string{"lab", "exec", "--root", e.cfg.root, "--lab", lab, node, "--"}, argv...)...)
	}
}

// InNetns runs commands inside a named network namespace.
func InNetns(ns string) Cmd {
	return func(ctx context.Context, argv ...string) *exec.Cmd {
		return command(ctx, append([]string{"ip", "netns", "exec", ns}, argv...)...)
	}
}

// IP runs `ip` once per step, stopping at the first failure.
func IP(ctx context.Context, steps ...[]string) error {
	for _, s := range steps {
		if _, err := output(command(ctx, append([]string{"ip"}, s...)...)); err != nil {
			return err
		}
	}
	return nil
}

// Once builds the fixture named key the first time it is asked for (by
// any scenario) and returns how that went every time: scenarios that share
// a fixture (a routing namespace, say) each ask for it.
func (e *Env) Once(key string, build func() error) error {
	if err, ok := e.once[key]; ok {
		return err
	}
	err := build()
	e.once[key] = err
	return err
}

// Netns makes namespace netnsPrefix+suffix, like a lab's: IPv4 only (no
// IPv6 autoconfiguration traffic in the way), loopback up. Cleanup removes
// every namespace with that prefix, so a scenario names its namespaces and
// removes none itself.
func (e *Env) Netns(ctx context.Context, suffix string) (string, error) {
	ns := netnsPrefix + suffix
	err := IP(ctx,
		[]string{"netns", "add", ns},
		[]string{"netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"},
		[]string{"-n", ns, "link", "set", "lo", "up"})
	return ns, err
}

// LabSpec is a two-host lab (h1, h2, on one fabric) the bench brings up.
type LabSpec struct {
	Name     string // unique among the bench's labs
	Datapath string // onehop or bridge
	Body     string // the topology's farms and vms, YAML
}

// Lab is a lab the bench brought up.
type Lab struct {
	env    *Env
	Name   string
	status []byte // `lab status -o json`
}

// Lab brings up spec's lab the first time a scenario asks for it.
func (e *Env) Lab(ctx context.Context, spec LabSpec) (*Lab, error) {
	if l, ok := e.labs[spec.Name]; ok {
		return l, nil
	}
	var l *Lab
	err := e.Once("lab "+spec.Name, func() (err error) {
		l, err = e.labUp(ctx, spec)
		return err
	})
	if err != nil {
		return nil, err
	}
	e.labs[spec.Name] = l
	return l, nil
}

func (e *Env) labUp(ctx context.Context, spec LabSpec) (*Lab, error) {
	progress("setup: lab %s (datapath %s)", spec.Name, spec.Datapath)
	topo := fmt.Sprintf("# written by onehop's bench\nname: %s\ndatapath: %s\nhosts:\n  - name: h1\n  - name: h2\n%s",
		spec.Name, spec.Datapath, spec.Body)
	path := filepath.Join(e.tmp, spec.Name+".yaml")
	if err := os.WriteFile(path, []byte(topo), 0o600); err != nil {
		return nil, err
	}
	// The marker first: a `lab up` killed halfway leaves namespaces but
	// maybe no state, and the next run must know the lab was the bench's.
	if err := os.WriteFile(filepath.Join(e.cfg.root, labMarker+spec.Name), nil, 0o600); err != nil {
		return nil, err
	}
	start := time.Now()
	if out, err := e.onehop(ctx, "lab", "up", path, "--root", e.cfg.root).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("lab up %s: %v\n%s", spec.Name, err, out)
	}
	progress("setup: lab %s is up in %.1fs", spec.Name, time.Since(start).Seconds())
	status, err := output(e.onehop(ctx, "lab", "status", "--root", e.cfg.root, "--lab", spec.Name, "-o", "json"))
	if err != nil {
		return nil, err
	}
	return &Lab{env: e, Name: spec.Name, status: status}, nil
}

// Addr is the IPv4 address of a VM of the lab.
func (l *Lab) Addr(vm string) (string, error) {
	ip, err := VMAddress(l.status, vm)
	if err != nil {
		return "", fmt.Errorf("lab %s: %w", l.Name, err)
	}
	return ip, nil
}

// Netns is the namespace of a node of the lab.
func (l *Lab) Netns(node string) string { return lab.NamespaceOf(l.Name, node) }

// FabricNetns is the namespace of the lab's fabric (its bridge,
// lab.FabricBridge).
func (l *Lab) FabricNetns() string { return lab.NamespaceOf(l.Name, "fabric") }

// Pair is from -> to inside the lab.
func (l *Lab) Pair(from, to string) (*Pair, error) {
	ip, err := l.Addr(to)
	if err != nil {
		return nil, err
	}
	return &Pair{DstIP: ip, Src: l.env.inLab(l.Name, from), Dst: l.env.inLab(l.Name, to), Server: l.Name + "/" + to}, nil
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

// startServer runs one iperf3 server in p's receiver for the whole run (one
// per receiver, shared by the scenarios that use it) and waits until it
// listens. It is a child of the bench (not `iperf3 -D`), so cleanup can stop
// it by pid even once its namespace is gone.
func (e *Env) startServer(ctx context.Context, p *Pair) error {
	return e.startListener(ctx, p, p.Server, iperfPort, []string{"iperf3", "-s", "-p", iperfPort})
}

// startListener runs argv in p's receiver as the server named key (one per
// key) and waits until something listens on TCP port there.
func (e *Env) startListener(ctx context.Context, p *Pair, key, port string, argv []string) error {
	e.mu.Lock()
	if s, ok := e.servers[key]; ok && !s.exited() {
		e.mu.Unlock()
		return nil
	}
	e.mu.Unlock()
	name := filepath.Base(argv[0])
	if slices.Contains(argv, rrperfArg) {
		name = rrperfArg
	}
	logf, err := os.CreateTemp(e.tmp, name+"-server-"+strings.ReplaceAll(p.Server, "/", "-")+"-*.log")
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	// Not bound to ctx: cleanup stops it, after the clients.
	s := &server{cmd: e.tool(p.Dst(context.Background(), argv...)), log: logf.Name(), done: make(chan struct{})}
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("%s: %s server: %w", p.Server, name, err)
	}
	e.mu.Lock()
	e.servers[key] = s
	e.mu.Unlock()
	go func() { s.err = s.cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _ := p.Dst(ctx, "ss", "-Hltn", "sport = :"+port).Output()
		if len(bytes.TrimSpace(out)) > 0 {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("%s: %s server exited (%v): %s", p.Server, name, s.err, tailFile(s.log))
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %s server not listening on %s after 10s: %s", p.Server, name, port, tailFile(s.log))
		}
	}
}

func (e *Env) serverOf(p *Pair) *server {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.servers[p.Server]
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

// cgroup2Mount returns where the cgroup v2 hierarchy is mounted
// (/sys/fs/cgroup on a unified system, /sys/fs/cgroup/unified on a hybrid
// one), or "" if it is not.
func cgroup2Mount() string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[2] == "cgroup2" {
			return f[1]
		}
	}
	return ""
}

func cgroupDir() string {
	if m := cgroup2Mount(); m != "" {
		return filepath.Join(m, cgroupName)
	}
	return ""
}

// makeCgroup creates the tools' cgroup. Without cgroup v2 (or without the
// right to create one) the bench runs on, without the endpoints' share of
// the CPU figure; the machine's figure does not need it.
func (e *Env) makeCgroup() {
	dir := cgroupDir()
	if dir == "" {
		progress("setup: no cgroup v2 hierarchy: the CPU figure goes without the endpoints' share")
		return
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		progress("setup: cgroup %s: %v: the CPU figure goes without the endpoints' share", dir, err)
		return
	}
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		progress("setup: cgroup %s: %v: the CPU figure goes without the endpoints' share", dir, err)
		os.Remove(dir)
		return
	}
	e.cgroup, e.cgfd = dir, fd
}

// removeCgroup kills whatever is still in the tools' cgroup (cgroup.kill:
// the whole cgroup at once, forks included) and removes it.
func removeCgroup(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
		return fmt.Errorf("kill cgroup %s: %w", dir, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		if len(bytes.TrimSpace(procs)) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: processes %s outlived cgroup.kill", dir, strings.Fields(string(procs)))
		}
		time.Sleep(20 * time.Millisecond) // dying processes leave it on their own time; nothing to wait on
	}
	if err := os.Remove(dir); err != nil {
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	return nil
}

// benchLabs lists the labs of the bench that may be there: those with a
// marker (the bench began to bring them up) and any state under the bench's
// own root.
func (e *Env) benchLabs() []string {
	entries, _ := os.ReadDir(e.cfg.root)
	var out []string
	for _, en := range entries {
		n := en.Name()
		switch {
		case strings.HasPrefix(n, labMarker):
			out = append(out, strings.TrimPrefix(n, labMarker))
		case en.IsDir() && !strings.HasPrefix(n, "."):
			out = append(out, n)
		}
	}
	return uniq(out)
}

func uniq(xs []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// labThere tells whether anything of lab is left: state or namespaces.
func (e *Env) labThere(name string) bool {
	if _, err := os.Stat(filepath.Join(e.cfg.root, name)); err == nil {
		return true
	}
	return len(netnsWithPrefix(lab.NamespaceOf(name, ""))) > 0
}

// netnsWithPrefix lists the named namespaces whose names start with prefix
// (none when they cannot be listed: cleanup then finds nothing to remove,
// and says what is still there).
func netnsWithPrefix(prefix string) []string {
	out, _ := netns.List(prefix)
	return out
}

// leftovers lists what exists of the bench's: labs, its own namespaces, the
// tools' cgroup.
func (e *Env) leftovers() []string {
	var out []string
	for _, lab := range e.benchLabs() {
		if e.labThere(lab) {
			out = append(out, "lab "+lab)
		}
	}
	out = append(out, netnsWithPrefix(netnsPrefix)...)
	out = append(out, cniLeftovers(e.cfg.root)...)
	if dir := cgroupDir(); dir != "" {
		if _, err := os.Stat(dir); err == nil {
			out = append(out, "cgroup "+dir)
		}
	}
	return out
}

// cleanup removes everything the bench makes, whether this run made it or an
// interrupted earlier one did; it is safe when nothing is there, keeps going
// past errors, and fails only if something is still there afterwards.
func (e *Env) cleanup() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	// 0. What scenarios hold in this process (last first).
	for i := len(e.closers) - 1; i >= 0; i-- {
		if err := e.closers[i](); err != nil {
			errs = append(errs, err)
		}
	}
	e.closers = nil
	// 1. Our servers (iperf3, rrperf), by pid.
	e.mu.Lock()
	for key, s := range e.servers {
		s.stop()
		delete(e.servers, key)
	}
	e.mu.Unlock()
	// 2. Tools still running: all of the tools' cgroup at once; and, for a
	// machine without one, iperf3 and ping inside the bench's namespaces.
	if e.cgfd >= 0 {
		syscall.Close(e.cgfd)
		e.cgfd = -1
	}
	if dir := cgroupDir(); dir != "" {
		if _, err := os.Stat(dir); err == nil {
			if err := removeCgroup(dir); err != nil {
				errs = append(errs, err)
			}
		}
	}
	labs := e.benchLabs()
	killStrays(ctx, labs)
	// 3. The labs: `lab down` stops their daemons and removes namespaces,
	// pins and state; it also cleans namespaces a crashed `lab up` left
	// without state. A lab that is not there at all is not an error.
	for _, name := range labs {
		if e.labThere(name) {
			if out, err := e.onehop(ctx, "lab", "down", "--root", e.cfg.root, "--lab", name).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("lab down %s: %v\n%s", name, err, out))
				continue
			}
		}
		if !e.labThere(name) {
			os.Remove(filepath.Join(e.cfg.root, labMarker+name))
		}
	}
	// 4. The bench's own namespaces (their veths and bridges go with them).
	for _, ns := range netnsWithPrefix(netnsPrefix) {
		if _, err := output(command(ctx, "ip", "netns", "del", ns)); err != nil {
			errs = append(errs, err)
		}
	}
	// 5. Files plugins keep (scenario_cni.go).
	for _, p := range cniLeftovers(e.cfg.root) {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	if left := e.leftovers(); len(left) > 0 {
		errs = append(errs, fmt.Errorf("still there after cleanup: %s", strings.Join(left, " ")))
	}
	return errors.Join(errs...)
}

// killStrays kills iperf3 and ping processes inside the bench's namespaces
// and its labs' VMs, by pid. With the tools' cgroup they are gone already;
// without it, a bench killed hard leaves its iperf3 servers there only if
// Pdeathsig failed, and they would keep the namespaces alive.
func killStrays(ctx context.Context, labs []string) {
	nss := netnsWithPrefix(netnsPrefix)
	daemons := map[string]bool{} // hosts run the lab's daemons: `lab down` stops those
	for _, name := range labs {
		nss = append(nss, netnsWithPrefix(lab.NamespaceOf(name, ""))...)
		for _, node := range []string{"h1", "h2", "fabric", "controller"} {
			daemons[lab.NamespaceOf(name, node)] = true
		}
	}
	for _, ns := range nss {
		if daemons[ns] {
			continue
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
