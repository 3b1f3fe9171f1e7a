// Package scale is the control plane's scale harness (issue 12): the real
// controller against etcd (embedded, or an external cluster of etcd
// processes) and many simulated hosts, each the real agent code
// (agent.New and Run) with its datapath replaced by a Recorder and its
// interfaces faked, in this one process. It creates farms, subnets, rules,
// peerings and VMs through the REST API, changes rules, moves VMs and
// restarts the controller, and measures what each step costs and how long
// every affected agent takes to apply it.
//
// Correctness (every agent converges, no intent is lost, nothing is taken
// out of a datapath across a controller restart) is checked; timings are
// only reported, against the targets.
package scale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/onehop/onehop/internal/agent"
	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// Config sizes one run.
type Config struct {
	Hosts, VMs, Farms int
	SubnetsPerFarm    int
	RuleChanges       int // rules added one at a time after the creates
	Moves             int // VMs moved one at a time

	// Revocations is how many rules are deleted one at a time after the
	// rule changes (those rules first, then rules added for it, untimed).
	Revocations int

	// Block is how many creates one line of the create table covers.
	Block int
	// Cluster runs against an external cluster of this many etcd
	// processes (EtcdBinary) instead of the controller's embedded etcd;
	// KillMember kills its leader when half the VMs are created.
	Cluster    int
	EtcdBinary string
	KillMember bool
	// Binary runs the controller as `Binary controller` (its memory is
	// then measured on its own); empty runs it in this process.
	Binary string
	// AgentsPerClient is how many simulated agents share one etcd client
	// (1: each its own connection, as real hosts).
	AgentsPerClient int
	// Resync is the agents' --resync; StatusEvery their --status-interval
	// (0: the agent's default).
	Resync      time.Duration
	StatusEvery time.Duration
	// APIClients is how many creates are in flight at once.
	APIClients int
	// Wait bounds every wait for agents to apply something.
	Wait time.Duration
	// Dir holds etcd's data and the logs; Progress gets a line per step.
	Dir      string
	Progress io.Writer
}

func (c *Config) defaults() error {
	if c.Hosts < 1 || c.VMs < 1 || c.Farms < 1 {
		return fmt.Errorf("scale: hosts %d, vms %d, farms %d: each must be at least 1", c.Hosts, c.VMs, c.Farms)
	}
	if c.Farms > 250 {
		return fmt.Errorf("scale: farms %d: at most 250 (10.f.s.h)", c.Farms)
	}
	if c.SubnetsPerFarm < 2 {
		c.SubnetsPerFarm = 2
	}
	if c.VMs/c.Farms/c.SubnetsPerFarm > 250 {
		return fmt.Errorf("scale: %d VMs in %d farms of %d subnets: over 250 per subnet", c.VMs, c.Farms, c.SubnetsPerFarm)
	}
	if c.Block < 1 {
		c.Block = 1000
	}
	if c.AgentsPerClient < 1 {
		c.AgentsPerClient = 1
	}
	if c.Resync <= 0 {
		c.Resync = 2 * time.Second
	}
	if c.APIClients < 1 {
		c.APIClients = 1
	}
	if c.Wait <= 0 {
		c.Wait = 2 * time.Minute
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Dir == "" {
		return errors.New("scale: Dir is required")
	}
	return nil
}

// harness is one run's state.
type harness struct {
	cfg   Config
	log   func(format string, args ...any)
	ctrl  *controllerRun
	api   *apiClient
	etcd  *clientv3.Client
	eps   []string
	clust *cluster

	names   []string // host names, by number
	recs    map[string]*Recorder
	stores  map[string]*countingStore
	logs    map[string]*countingWriter
	clients []*store.Etcd
	stopAll context.CancelFunc
	agents  sync.WaitGroup

	farms   []intent.Farm
	subnets map[string]intent.Subnet // farm/subnet
	vms     []vmState                // by number
	rules   []wantRule               // within-farm rules, which take effect at once
	revoked []wantRule               // rules deleted: no host may hold them
	report  *Report
}

type vmState struct {
	farm, subnet, name, host string
	ip                       netip.Addr
}

type wantRule struct {
	farm int
	key  datapath.VisKey
	id   uint32 // its id in the farm (intent.Rule.ID); 0 for the rules of createFarms
}

// Run runs the whole scenario and returns its report. An error means the
// harness could not run or correctness failed (the report so far is
// returned with it).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	h := &harness{cfg: cfg, recs: map[string]*Recorder{}, stores: map[string]*countingStore{},
		logs: map[string]*countingWriter{}, subnets: map[string]intent.Subnet{}, report: &Report{Config: cfg}}
	start := time.Now()
	h.log = func(format string, args ...any) {
		fmt.Fprintf(cfg.Progress, "[%6.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	defer h.close()
	err := h.run(ctx)
	h.report.Elapsed = time.Since(start)
	if err != nil {
		h.report.Failed = err.Error()
	}
	return h.report, err
}

// Phases of a run, in order; Report.Done lists those that completed.
const (
	PhaseCreates = "creates"
	PhaseRules   = "rules"
	PhaseMoves   = "moves"
	PhaseRestart = "restart"
	PhaseVerify  = "verify"
	PhaseStore   = "store"

	// PhaseRevocations deletes rules one at a time (issue 21).
	PhaseRevocations = "revocations"
)

func (h *harness) run(ctx context.Context) error {
	for _, step := range []struct {
		phase string
		do    func(context.Context) error
	}{
		{"", h.startStore}, {"", h.seedHosts}, {"", h.startAgents}, {"", h.createFarms},
		{PhaseCreates, h.createVMs}, {PhaseRules, h.changeRules}, {PhaseRevocations, h.revokeRules}, {PhaseMoves, h.moveVMs},
		{PhaseRestart, h.restartController}, {PhaseVerify, h.verify}, {PhaseStore, h.measureStore},
	} {
		if err := step.do(ctx); err != nil {
			return err
		}
		if step.phase != "" {
			h.report.Done = append(h.report.Done, step.phase)
		}
	}
	return nil
}

// startStore starts etcd (an external cluster, or the controller's own) and
// the controller with its REST API on loopback.
func (h *harness) startStore(ctx context.Context) error {
	apiPort, err := freePort()
	if err != nil {
		return err
	}
	cfg := controller.DaemonConfig{APIListen: fmt.Sprintf("127.0.0.1:%d", apiPort), Insecure: true}
	if h.cfg.Cluster > 0 {
		if h.clust, err = startCluster(ctx, h.cfg.EtcdBinary, h.cfg.Dir, h.cfg.Cluster); err != nil {
			return err
		}
		h.eps = h.clust.endpoints()
		cfg.EtcdEndpoints = h.eps
		h.log("external etcd: %d members at %v", h.cfg.Cluster, h.eps)
	} else {
		cp, err := freePort()
		if err != nil {
			return err
		}
		pp, err := freePort()
		if err != nil {
			return err
		}
		cfg.DataDir = filepath.Join(h.cfg.Dir, "etcd")
		cfg.ClientURL = fmt.Sprintf("http://127.0.0.1:%d", cp)
		cfg.PeerURL = fmt.Sprintf("http://127.0.0.1:%d", pp)
		h.eps = []string{cfg.ClientURL}
		h.log("embedded etcd in the controller at %s", cfg.ClientURL)
	}
	h.ctrl = &controllerRun{cfg: cfg, binary: h.cfg.Binary, logTo: filepath.Join(h.cfg.Dir, "controller.log")}
	h.api = newAPIClient("http://"+cfg.APIListen, h.cfg.APIClients)
	if err := h.startController(ctx); err != nil {
		return err
	}
	if h.etcd, err = dial(h.eps); err != nil {
		return err
	}
	return nil
}

func (h *harness) startController(ctx context.Context) error {
	if err := h.ctrl.start(); err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := h.api.ready(ctx); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("controller API not ready after 60s: %w", err)
		}
		if err := h.ctrl.exited(); err != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond) // poll interval while the controller starts
	}
}

// seedHosts puts the hosts in the intent as a topology file would: the
// REST API has no call that adds a host.
func (h *harness) seedHosts(ctx context.Context) error {
	s, err := store.DialEtcd(h.eps)
	if err != nil {
		return err
	}
	defer s.Close()
	t := &topology.File{Path: "scale-harness"}
	for i := 0; i < h.cfg.Hosts; i++ {
		name := fmt.Sprintf("h%04d", i)
		h.names = append(h.names, name)
		t.Hosts = append(t.Hosts, topology.Host{Name: name, Address: hostInterfaces{index: i}.address()})
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := controller.New(s, quiet).ApplyTopology(ctx, t); err != nil {
		return fmt.Errorf("seed %d hosts: %w", h.cfg.Hosts, err)
	}
	h.log("seeded %d hosts", h.cfg.Hosts)
	return nil
}

// startAgents runs one real agent per host and waits until every one has
// registered its node.
func (h *harness) startAgents(ctx context.Context) error {
	actx, cancel := context.WithCancel(context.Background())
	h.stopAll = cancel
	var client *store.Etcd
	for i, name := range h.names {
		if i%h.cfg.AgentsPerClient == 0 {
			c, err := store.DialEtcd(h.eps)
			if err != nil {
				return err
			}
			h.clients = append(h.clients, c)
			client = c
		}
		rec := newRecorder(name)
		cs := &countingStore{Store: client, host: intent.DesiredHostPrefix(name)}
		lw := &countingWriter{}
		a, err := agent.New(agent.Config{Node: name, Uplink: "uplink0", Resync: h.cfg.Resync, StatusEvery: h.cfg.StatusEvery}, cs, rec,
			hostInterfaces{uplink: "uplink0", index: i}, slog.New(slog.NewTextHandler(lw, nil)))
		if err != nil {
			return fmt.Errorf("agent %s: %w", name, err)
		}
		h.recs[name], h.stores[name], h.logs[name] = rec, cs, lw
		h.agents.Add(1)
		go func() {
			defer h.agents.Done()
			a.Run(actx)
		}()
	}
	h.log("started %d agents (%d etcd clients)", len(h.names), len(h.clients))
	err := h.until(ctx, "every agent to register its node", func() (bool, string) {
		r, err := h.etcd.Get(ctx, intent.NodesPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return false, err.Error()
		}
		return r.Count >= int64(len(h.names)), fmt.Sprintf("%d of %d registered", r.Count, len(h.names))
	})
	if err != nil {
		return err
	}
	h.log("every agent registered")
	return nil
}

// until polls cond every 100 ms for up to Wait.
func (h *harness) until(ctx context.Context, what string, cond func() (bool, string)) error {
	deadline := time.Now().Add(h.cfg.Wait)
	for {
		ok, state := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v: %s (%s)", h.cfg.Wait, what, state)
		}
		if err := h.ctrl.exited(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond): // the poll interval
		}
	}
}

func (h *harness) farmName(f int) string   { return fmt.Sprintf("farm%03d", f) }
func (h *harness) subnetName(s int) string { return fmt.Sprintf("s%d", s) }
func (h *harness) vmsPerFarm() int         { return (h.cfg.VMs + h.cfg.Farms - 1) / h.cfg.Farms }
func (h *harness) subnetOf(f, s int) intent.Subnet {
	return h.subnets[h.farmName(f)+"/"+h.subnetName(s)]
}

// createFarms creates the farms, their subnets, a rule inside each farm and
// peerings with cross-farm rules between pairs of farms.
func (h *harness) createFarms(ctx context.Context) error {
	for f := 0; f < h.cfg.Farms; f++ {
		var farm intent.Farm
		if _, err := h.api.do(ctx, "POST", "/v1/farms", map[string]any{"name": h.farmName(f)}, &farm); err != nil {
			return err
		}
		h.farms = append(h.farms, farm)
		for s := 0; s < h.cfg.SubnetsPerFarm; s++ {
			var sub intent.Subnet
			if _, err := h.api.do(ctx, "POST", "/v1/farms/"+farm.Name+"/subnets", map[string]any{"name": h.subnetName(s)}, &sub); err != nil {
				return err
			}
			h.subnets[farm.Name+"/"+sub.Name] = sub
		}
		if err := h.allow(ctx, f, 5432); err != nil {
			return err
		}
		if (f+1)%10 == 0 {
			h.log("created %d/%d farms with their subnets", f+1, h.cfg.Farms)
		}
	}
	peerings := 0
	for f := 0; f+1 < h.cfg.Farms; f += 2 {
		a, b := h.farmName(f), h.farmName(f+1)
		for _, p := range [][2]string{{a, b}, {b, a}} {
			if _, err := h.api.do(ctx, "PUT", "/v1/farms/"+p[0]+"/peers/"+p[1], nil, nil); err != nil {
				return err
			}
			rule := intent.Rule{From: p[0] + "/s0", To: p[1] + "/s1", Proto: "tcp", Port: 443}
			for _, owner := range p {
				if _, err := h.api.do(ctx, "POST", "/v1/farms/"+owner+"/rules", rule, nil); err != nil {
					return err
				}
			}
		}
		peerings++
	}
	h.log("created %d farms, %d subnets, %d rules inside farms, %d peerings", len(h.farms), len(h.subnets), len(h.rules), peerings)
	return nil
}

// allow adds farm f's rule s0 -> s1 tcp/port and remembers it.
func (h *harness) allow(ctx context.Context, f int, port uint16) error {
	farm := h.farmName(f)
	rule := intent.Rule{From: farm + "/s0", To: farm + "/s1", Proto: "tcp", Port: port}
	var made intent.Rule
	if _, err := h.api.do(ctx, "POST", "/v1/farms/"+farm+"/rules", rule, &made); err != nil {
		return err
	}
	want := h.ruleKey(f, port)
	want.id = made.ID
	h.rules = append(h.rules, want)
	return nil
}

func (h *harness) ruleKey(f int, port uint16) wantRule {
	s0, s1 := h.subnetOf(f, 0), h.subnetOf(f, 1)
	id := h.farms[f].ID
	return wantRule{farm: f, key: datapath.VisKey{SrcFarm: id, SrcSubnet: s0.ID, DstFarm: id, DstSubnet: s1.ID, Proto: 6, Port: port}}
}

// placement is where VM number i goes: farm by farm, its subnets in
// turn, and hosts round robin, so a farm's VMs spread over many hosts.
func (h *harness) placement(i int) vmState {
	per := h.vmsPerFarm()
	f, j := i/per, i%per
	return vmState{farm: h.farmName(f), subnet: h.subnetName(j % h.cfg.SubnetsPerFarm), name: fmt.Sprintf("vm%05d", i),
		host: h.names[i%len(h.names)]}
}

// createVMs creates every VM through the API, timing each request, and
// then waits until every host has applied exactly its VMs.
func (h *harness) createVMs(ctx context.Context) error {
	h.vms = make([]vmState, h.cfg.VMs)
	lat := make([]time.Duration, h.cfg.VMs)
	done := make([]time.Time, h.cfg.VMs)
	next := make(chan int)
	errs := make(chan error, h.cfg.APIClients)
	var wg sync.WaitGroup
	var mu sync.Mutex
	created := 0
	blockStart := time.Now()
	// The CPU this process and the controller's have used, at the start
	// and at the end of every block: what a create costs whatever else
	// the machine runs (a rate moves with the machine's load).
	cpu := func() time.Duration { return selfCPU() + h.ctrl.cpu() }
	cpuAt := []time.Duration{cpu()}
	killed := false
	for w := 0; w < h.cfg.APIClients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				v := h.placement(i)
				t0 := time.Now()
				var out intent.VM
				err := h.createVM(ctx, v, &out)
				lat[i], done[i] = time.Since(t0), time.Now()
				if err != nil {
					errs <- err
					return
				}
				v.ip = netip.MustParseAddr(out.IP)
				h.vms[i] = v
				mu.Lock()
				created++
				if created%h.cfg.Block == 0 || created == h.cfg.VMs {
					cpuAt = append(cpuAt, cpu())
				}
				if created%h.cfg.Block == 0 {
					h.log("created %d/%d VMs (this block: %.0f/s, %v of CPU a create)", created, h.cfg.VMs, float64(h.cfg.Block)/time.Since(blockStart).Seconds(),
						((cpuAt[len(cpuAt)-1] - cpuAt[len(cpuAt)-2]) / time.Duration(h.cfg.Block)).Round(time.Microsecond))
					blockStart = time.Now()
				}
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
	var err error
feed:
	for i := 0; i < h.cfg.VMs; i++ {
		if h.clust != nil && h.cfg.KillMember && !killed && i == h.cfg.VMs/2 {
			killed = true
			name, kerr := h.clust.killLeader(ctx)
			if kerr != nil {
				err = kerr
				break
			}
			h.report.KilledMember = name
			h.log("killed etcd member %s (the leader) after %d creates", name, i)
		}
		select {
		case next <- i:
		case err = <-errs:
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err == nil && len(errs) > 0 {
		err = <-errs
	}
	if err != nil {
		// What was measured before the stop is still worth reading: the
		// blocks of the creates answered so far, in order.
		n := 0
		for n < len(done) && !done[n].IsZero() && h.vms[n].ip.IsValid() {
			n++
		}
		h.report.Creates = blocks(lat[:n], done[:n], start, h.cfg.Block)
		return err
	}
	last := time.Time{}
	for _, t := range done {
		if t.After(last) {
			last = t
		}
	}
	h.report.CreateTotal = last.Sub(start)
	h.report.Creates = blocks(lat, done, start, h.cfg.Block)
	for i := range h.report.Creates {
		if b := &h.report.Creates[i]; i+1 < len(cpuAt) {
			b.CPU = (cpuAt[i+1] - cpuAt[i]) / time.Duration(b.Last-b.First+1)
		}
	}
	h.report.APIRetries = h.api.nretry.Load()
	h.log("created %d VMs in %v; waiting for every host to apply exactly its VMs", h.cfg.VMs, h.report.CreateTotal.Round(time.Millisecond))

	times, err := h.awaitAll(ctx, h.names, func(host string) func(View) bool {
		want := h.expectedEndpoints(host)
		return func(v View) bool { return sameKeys(v.Endpoints, want) }
	})
	if err != nil {
		return fmt.Errorf("after the creates: %w", err)
	}
	h.report.AllAppliedAfterLastCreate = maxSince(times, last)
	h.log("every host applied its VMs %v after the last create", h.report.AllAppliedAfterLastCreate.Round(time.Millisecond))
	return nil
}

// createVM creates one VM; a create the store failed (a 5xx while an etcd
// member is down) is retried, and a retry finding it created is taken.
func (h *harness) createVM(ctx context.Context, v vmState, out *intent.VM) error {
	body := map[string]any{"name": v.name, "host": v.host}
	path := "/v1/farms/" + v.farm + "/subnets/" + v.subnet + "/vms"
	for try := 0; ; try++ {
		status, err := h.api.do(ctx, "POST", path, body, out)
		if err == nil {
			return nil
		}
		if status == 409 && try > 0 {
			var vms []intent.VM
			if _, gerr := h.api.do(ctx, "GET", "/v1/vms", nil, &vms); gerr != nil {
				return gerr
			}
			for _, x := range vms {
				if x.Name == v.name {
					*out = x
					return nil
				}
			}
			return err
		}
		if status != 0 && status < 500 || try >= 20 {
			return err
		}
		h.api.retried()
		time.Sleep(250 * time.Millisecond) // back off while the store recovers
	}
}

func (h *harness) expectedEndpoints(host string) map[uint32]bool {
	want := map[uint32]bool{}
	for _, v := range h.vms {
		if v.host == host {
			want[datapath.IPKey(v.ip)] = true
		}
	}
	return want
}

// hostsOfFarm lists the hosts holding a VM of farm f: those a rule of f
// concerns.
func (h *harness) hostsOfFarm(f int) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range h.vms {
		if v.farm == h.farmName(f) && !seen[v.host] {
			seen[v.host] = true
			out = append(out, v.host)
		}
	}
	sort.Strings(out)
	return out
}

// awaitAll waits until cond(host) holds on every host's recorder and
// returns when each first held.
func (h *harness) awaitAll(ctx context.Context, hosts []string, cond func(host string) func(View) bool) ([]time.Time, error) {
	type pending struct {
		ch     <-chan time.Time
		cancel func()
	}
	ps := make([]pending, len(hosts))
	for i, host := range hosts {
		ch, cancel := h.recs[host].await(cond(host))
		ps[i] = pending{ch, cancel}
	}
	return h.collect(ctx, hosts, func(i int) (<-chan time.Time, func()) { return ps[i].ch, ps[i].cancel })
}

func (h *harness) collect(ctx context.Context, hosts []string, p func(i int) (<-chan time.Time, func())) ([]time.Time, error) {
	out := make([]time.Time, len(hosts))
	timeout := time.After(h.cfg.Wait)
	for i := range hosts {
		ch, _ := p(i)
		select {
		case out[i] = <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timeout:
			late := 0
			for j := i; j < len(hosts); j++ {
				ch, cancel := p(j)
				cancel()
				select {
				case <-ch:
				default:
					late++
				}
			}
			return nil, fmt.Errorf("%d of %d hosts had not applied it within %v (first: %s)", late, len(hosts), h.cfg.Wait, hosts[i])
		}
	}
	return out, nil
}

// changeRules adds rules one at a time, each timed from the request to the
// moment the last host holding a VM of its farm has applied it.
//
// The simulated agents share this process's heap (about 0.7 GiB at full
// size), where a real host's agent has its own of about 1 MiB. Collecting
// that shared heap takes the process's cores for most of a second, which
// no real host's agent would see, so it is collected just before the rule
// changes (as testing.B collects before a benchmark) and the collections
// that still fall among them are counted in the report.
func (h *harness) changeRules(ctx context.Context) error {
	var everywhere, perHost, request []time.Duration
	defer collectAndCount(&h.report.RuleHarnessGCs)()
	for k := 0; k < h.cfg.RuleChanges; k++ {
		f := k % h.cfg.Farms
		port := uint16(10000 + k)
		want := h.ruleKey(f, port)
		hosts := h.hostsOfFarm(f)
		chans := make([]<-chan time.Time, len(hosts))
		cancels := make([]func(), len(hosts))
		for i, host := range hosts {
			chans[i], cancels[i] = h.recs[host].await(func(v View) bool { return v.Vis[want.key] })
		}
		t0 := time.Now()
		if err := h.allow(ctx, f, port); err != nil {
			return err
		}
		request = append(request, time.Since(t0))
		times, err := h.collect(ctx, hosts, func(i int) (<-chan time.Time, func()) { return chans[i], cancels[i] })
		if err != nil {
			return fmt.Errorf("rule change %d (farm %s): %w", k, h.farmName(f), err)
		}
		for _, t := range times {
			perHost = append(perHost, t.Sub(t0))
		}
		everywhere = append(everywhere, maxSince(times, t0))
	}
	h.report.RuleChange = summarize(everywhere)
	h.report.RuleChangePerHost = summarize(perHost)
	h.report.RuleRequest = summarize(request)
	h.log("%d rule changes: applied everywhere %s", h.cfg.RuleChanges, h.report.RuleChange)
	return nil
}

// collectAndCount collects this process's heap now and returns what
// stores in n, when called, how many collections fell in between.
func collectAndCount(n *uint32) (done func()) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	gcs := ms.NumGC
	return func() {
		runtime.ReadMemStats(&ms)
		*n = ms.NumGC - gcs
	}
}

// revokeRules deletes rules one at a time (issue 21, "Revocation is
// immediate"), each timed from the request to the moment the last host
// holding a VM of its farm has applied the rule set without it: the
// moment a real agent's Apply moves its node's policy epoch on, after
// which the datapath cuts each flow the rule admitted at its next packet
// (docs/virtual-router.md, "Revocation"). The simulated agents have no
// datapath: the packet's part is not in this figure (the e2e test
// measures it on real hosts).
func (h *harness) revokeRules(ctx context.Context) error {
	var everywhere, perHost, request []time.Duration
	defer collectAndCount(&h.report.RevocationHarnessGCs)() // as changeRules: the simulated agents share one heap
	for k := 0; k < h.cfg.Revocations; k++ {
		i := -1
		for j := len(h.rules) - 1; j >= 0; j-- {
			if h.rules[j].id != 0 {
				i = j
				break
			}
		}
		if i < 0 {
			// The rule changes are all revoked: add one to revoke, untimed.
			f := k % h.cfg.Farms
			port := uint16(20000 + k)
			want := h.ruleKey(f, port)
			if err := h.allow(ctx, f, port); err != nil {
				return err
			}
			if _, err := h.awaitAll(ctx, h.hostsOfFarm(f), func(string) func(View) bool {
				return func(v View) bool { return v.Vis[want.key] }
			}); err != nil {
				return fmt.Errorf("rule to revoke %d (farm %s): %w", k, h.farmName(f), err)
			}
			i = len(h.rules) - 1
		}
		r := h.rules[i]
		hosts := h.hostsOfFarm(r.farm)
		chans := make([]<-chan time.Time, len(hosts))
		cancels := make([]func(), len(hosts))
		for j, host := range hosts {
			chans[j], cancels[j] = h.recs[host].await(func(v View) bool { return !v.Vis[r.key] })
		}
		t0 := time.Now()
		if _, err := h.api.do(ctx, "DELETE", fmt.Sprintf("/v1/farms/%s/rules/%d", h.farmName(r.farm), r.id), nil, nil); err != nil {
			for _, c := range cancels {
				c()
			}
			return fmt.Errorf("revocation %d (farm %s rule %d): %w", k, h.farmName(r.farm), r.id, err)
		}
		request = append(request, time.Since(t0))
		times, err := h.collect(ctx, hosts, func(j int) (<-chan time.Time, func()) { return chans[j], cancels[j] })
		if err != nil {
			return fmt.Errorf("revocation %d (farm %s rule %d): %w", k, h.farmName(r.farm), r.id, err)
		}
		for _, t := range times {
			perHost = append(perHost, t.Sub(t0))
		}
		everywhere = append(everywhere, maxSince(times, t0))
		h.rules = append(h.rules[:i], h.rules[i+1:]...)
		h.revoked = append(h.revoked, r)
	}
	h.report.Revocation = summarize(everywhere)
	h.report.RevocationPerHost = summarize(perHost)
	h.report.RevocationRequest = summarize(request)
	h.log("%d revocations: applied everywhere %s", len(everywhere), h.report.Revocation)
	return nil
}

// moveVMs moves VMs one at a time to another host, each timed until the
// new host has it and the old one no longer does.
func (h *harness) moveVMs(ctx context.Context) error {
	var took []time.Duration
	for k := 0; k < h.cfg.Moves && len(h.names) > 1; k++ {
		i := (k * 7919) % len(h.vms)
		v := h.vms[i]
		to := h.names[(i+1+k)%len(h.names)]
		if to == v.host {
			to = h.names[(i+2+k)%len(h.names)]
		}
		key := datapath.IPKey(v.ip)
		chTo, cancelTo := h.recs[to].await(func(x View) bool { return x.Endpoints[key] })
		chFrom, cancelFrom := h.recs[v.host].await(func(x View) bool { return !x.Endpoints[key] })
		t0 := time.Now()
		if _, err := h.api.do(ctx, "PUT", "/v1/farms/"+v.farm+"/subnets/"+v.subnet+"/vms/"+v.name+"/host", map[string]any{"host": to}, nil); err != nil {
			cancelTo()
			cancelFrom()
			return err
		}
		pair := [2]<-chan time.Time{chTo, chFrom}
		cancel := [2]func(){cancelTo, cancelFrom}
		times, err := h.collect(ctx, []string{to, v.host}, func(j int) (<-chan time.Time, func()) { return pair[j], cancel[j] })
		if err != nil {
			return fmt.Errorf("move %s to %s: %w", v.name, to, err)
		}
		took = append(took, maxSince(times, t0))
		h.vms[i].host = to
	}
	h.report.Move = summarize(took)
	h.log("%d moves: applied on both hosts %s", len(took), h.report.Move)
	return nil
}

// restartController stops and starts the controller with every agent
// running, and compares what agents did in that window with an equally
// long quiet window just before: entries removed from any datapath (there
// must be none) and relists of desired state.
func (h *harness) restartController(ctx context.Context) error {
	window := 3*h.cfg.Resync + 2*time.Second
	h.log("quiet window of %v before the restart", window)
	c0 := h.agentCounters()
	time.Sleep(window) // the baseline: what agents do when nothing changes
	c1 := h.agentCounters()
	h.report.QuietRelists, h.report.QuietReads, h.report.QuietWatches = c1.relists-c0.relists, c1.reads-c0.reads, c1.watches-c0.watches

	t0 := time.Now()
	if err := h.ctrl.stop(); err != nil {
		return fmt.Errorf("stop controller: %w", err)
	}
	h.log("controller stopped; starting it again")
	if err := h.startController(ctx); err != nil {
		return fmt.Errorf("restart controller: %w", err)
	}
	h.report.RestartDowntime = time.Since(t0)
	// The new controller must still compile: one more rule, applied
	// everywhere it concerns.
	f := 0
	want := h.ruleKey(f, 9999)
	hosts := h.hostsOfFarm(f)
	if err := h.allow(ctx, f, 9999); err != nil {
		return fmt.Errorf("rule after the restart: %w", err)
	}
	if _, err := h.awaitAll(ctx, hosts, func(string) func(View) bool {
		return func(v View) bool { return v.Vis[want.key] }
	}); err != nil {
		return fmt.Errorf("rule after the restart: %w", err)
	}
	if rest := window - time.Since(t0); rest > 0 {
		time.Sleep(rest) // the same length as the quiet window
	}
	c2 := h.agentCounters()
	h.report.RestartRelists, h.report.RestartReads, h.report.RestartWatches = c2.relists-c1.relists, c2.reads-c1.reads, c2.watches-c1.watches
	h.report.RestartRemoved = c2.removed - c1.removed
	h.report.QuietRemoved = c1.removed - c0.removed
	h.log("controller restart: %d entries removed from datapaths, %d relists, %d other reads, %d watches opened (quiet window: %d, %d, %d)",
		h.report.RestartRemoved, h.report.RestartRelists, h.report.RestartReads, h.report.RestartWatches,
		h.report.QuietRelists, h.report.QuietReads, h.report.QuietWatches)
	return nil
}

// counters are every agent's store and datapath counts, summed.
type counters struct{ relists, reads, watches, removed int64 }

func (h *harness) agentCounters() counters {
	var c counters
	for _, name := range h.names {
		s := h.stores[name]
		c.relists += s.relists.Load()
		c.reads += s.reads.Load()
		c.watches += s.watches.Load()
		_, r := h.recs[name].stats()
		c.removed += int64(r)
	}
	return c
}

// verify checks that no intent was lost (the API lists every VM where it
// was put, and every rule) and that every agent holds exactly its VMs and
// every rule of its farms.
func (h *harness) verify(ctx context.Context) error {
	var vms []intent.VM
	if _, err := h.api.do(ctx, "GET", "/v1/vms", nil, &vms); err != nil {
		return err
	}
	have := map[string]intent.VM{}
	for _, v := range vms {
		have[v.FullName()] = v // a name is unique within its farm only
	}
	var lost []string
	for _, v := range h.vms {
		if got, ok := have[v.farm+"/"+v.subnet+"/"+v.name]; !ok || got.Host != v.host || got.IP != v.ip.String() {
			lost = append(lost, v.name)
		}
	}
	if len(lost) > 0 || len(vms) != len(h.vms) {
		return fmt.Errorf("intent lost: the API lists %d VMs, %d were created; %d missing or changed (first %v)", len(vms), len(h.vms), len(lost), first(lost, 5))
	}
	byHost := map[string][]datapath.VisKey{}
	for _, r := range h.rules {
		for _, host := range h.hostsOfFarm(r.farm) {
			byHost[host] = append(byHost[host], r.key)
		}
	}
	if _, err := h.awaitAll(ctx, h.names, func(host string) func(View) bool {
		want, rules := h.expectedEndpoints(host), byHost[host]
		return func(v View) bool {
			for _, k := range rules {
				if !v.Vis[k] {
					return false
				}
			}
			for _, r := range h.revoked {
				if v.Vis[r.key] {
					return false
				}
			}
			return sameKeys(v.Endpoints, want)
		}
	}); err != nil {
		return fmt.Errorf("final state: %w", err)
	}
	h.report.Converged = true
	if err := h.awaitAppliedRevisions(ctx); err != nil {
		return fmt.Errorf("final state: %w", err)
	}
	minRev := h.report.MinAppliedRevision
	var logBytes, logLines int64
	for _, name := range h.names {
		logBytes += h.logs[name].bytes.Load()
		logLines += h.logs[name].lines.Load()
	}
	h.report.Lists = h.agentCounters().relists
	h.report.AgentLogBytes, h.report.AgentLogLines = logBytes/int64(len(h.names)), logLines/int64(len(h.names))
	h.log("verified: %d VMs, %d rules in force; every agent converged (lowest applied revision %d)", len(vms), len(h.rules), minRev)
	return nil
}

// awaitAppliedRevisions waits until every agent's published status says
// it applied at least the revision of the latest change to any key it
// follows (its desired keys, the farm states of the farms it carries), as
// an operator would tell that a change reached a host, and records the
// lowest applied revision.
func (h *harness) awaitAppliedRevisions(ctx context.Context) error {
	farmID := map[string]uint16{}
	for f, farm := range h.farms {
		farmID[h.farmName(f)] = farm.ID
	}
	carried := map[string]map[uint16]bool{}
	for _, v := range h.vms {
		if carried[v.host] == nil {
			carried[v.host] = map[uint16]bool{}
		}
		carried[v.host][farmID[v.farm]] = true
	}
	return h.until(ctx, "every agent to publish the revision of its latest change as applied", func() (bool, string) {
		need := map[string]int64{}
		d, err := h.etcd.Get(ctx, intent.DesiredPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return false, err.Error()
		}
		for _, kv := range d.Kvs {
			host, _, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), intent.DesiredPrefix), "/")
			need[host] = max(need[host], kv.ModRevision)
		}
		fs, err := h.etcd.Get(ctx, intent.FarmStatePrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return false, err.Error()
		}
		for _, kv := range fs.Kvs {
			id, ok := intent.ParseFarmStateKey(string(kv.Key))
			if !ok {
				continue
			}
			for host, farms := range carried {
				if farms[id] {
					need[host] = max(need[host], kv.ModRevision)
				}
			}
		}
		st, err := h.etcd.Get(ctx, intent.StatusPrefix, clientv3.WithPrefix())
		if err != nil {
			return false, err.Error()
		}
		applied := map[string]int64{}
		for _, kv := range st.Kvs {
			var s intent.AgentStatus
			if err := json.Unmarshal(kv.Value, &s); err != nil {
				return false, fmt.Sprintf("decode %s: %v", kv.Key, err)
			}
			applied[s.Node] = s.AppliedRevision
		}
		var minRev int64 = -1
		var behind []string
		for _, name := range h.names {
			if applied[name] < need[name] {
				behind = append(behind, fmt.Sprintf("%s at %d of %d", name, applied[name], need[name]))
			}
			if minRev < 0 || applied[name] < minRev {
				minRev = applied[name]
			}
		}
		h.report.MinAppliedRevision = minRev
		return len(behind) == 0, fmt.Sprintf("%d agents behind (first %v)", len(behind), first(behind, 3))
	})
}

// measureStore reads etcd's database size, compacts and defragments it,
// and reads it again; and the memory figures.
func (h *harness) measureStore(ctx context.Context) error {
	size := func() (int64, int64, int64, error) {
		var db, inUse, rev int64
		for _, ep := range h.etcd.Endpoints() {
			if h.isKilled(ep) {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			st, err := h.etcd.Status(sctx, ep)
			cancel()
			if err != nil {
				return 0, 0, 0, fmt.Errorf("etcd status of %s: %w", ep, err)
			}
			db, inUse, rev = max(db, st.DbSize), max(inUse, st.DbSizeInUse), max(rev, st.Header.Revision)
		}
		return db, inUse, rev, nil
	}
	db, inUse, rev, err := size()
	if err != nil {
		return err
	}
	h.report.EtcdDB, h.report.EtcdDBInUse, h.report.EtcdRevision = db, inUse, rev
	if _, err := h.etcd.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return fmt.Errorf("compact etcd at %d: %w", rev, err)
	}
	for _, ep := range h.etcd.Endpoints() {
		if h.isKilled(ep) {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := h.etcd.Defragment(dctx, ep)
		cancel()
		if err != nil {
			return fmt.Errorf("defragment %s: %w", ep, err)
		}
	}
	if h.report.EtcdDBCompacted, _, _, err = size(); err != nil {
		return err
	}
	h.log("etcd database %s (%s in use) at revision %d; %s after compaction and defragmentation",
		mib(db), mib(inUse), rev, mib(h.report.EtcdDBCompacted))

	h.report.ControllerRSS, h.report.ControllerPeakRSS = h.ctrl.memory()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	h.report.AgentHeapEach = int64(ms.HeapInuse) / int64(len(h.names))
	h.report.HarnessRSS, _ = procMemory(os.Getpid())
	return nil
}

func (h *harness) isKilled(ep string) bool {
	if h.clust == nil {
		return false
	}
	for _, m := range h.clust.members {
		if m.client == ep && m.name == h.report.KilledMember {
			return true
		}
	}
	return false
}

func (h *harness) close() {
	if h.stopAll != nil {
		h.stopAll()
		h.agents.Wait()
	}
	for _, c := range h.clients {
		c.Close()
	}
	if h.etcd != nil {
		h.etcd.Close()
	}
	if h.ctrl != nil && h.ctrl.done != nil && h.ctrl.exited() == nil {
		h.ctrl.stop()
	}
	if h.clust != nil {
		h.clust.stop()
	}
}

func sameKeys(have, want map[uint32]bool) bool {
	if len(have) != len(want) {
		return false
	}
	for k := range want {
		if !have[k] {
			return false
		}
	}
	return true
}

func maxSince(ts []time.Time, t0 time.Time) time.Duration {
	var m time.Duration
	for _, t := range ts {
		m = max(m, t.Sub(t0))
	}
	return m
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }

// countingWriter is a simulated agent's log: only its size is kept.
type countingWriter struct{ bytes, lines atomic.Int64 }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.bytes.Add(int64(len(p)))
	w.lines.Add(1)
	return len(p), nil
}
