package scale

import (
	"fmt"
	"io"
	"sort"
	"time"
)

// Report is what one run measured.
type Report struct {
	Config  Config        `json:"-"`
	Elapsed time.Duration `json:"elapsed"`
	// Done lists the phases that completed (Phase*); Failed is why the
	// run stopped early, if it did.
	Done   []string `json:"done"`
	Failed string   `json:"failed,omitempty"`
	// Creates: one row per block of Config.Block creates, in order.
	Creates     []Block       `json:"creates"`
	CreateTotal time.Duration `json:"createTotal"`
	APIRetries  int64         `json:"apiRetries"` // creates retried after a 5xx (a member down)
	// AllAppliedAfterLastCreate: from the last create's answer until
	// every host held exactly its VMs.
	AllAppliedAfterLastCreate time.Duration `json:"allAppliedAfterLastCreate"`
	// RuleChange: from a rule's request until the last host concerned
	// applied it; RuleChangePerHost: the same for each host on its own.
	RuleChange        Summary `json:"ruleChange"`
	RuleChangePerHost Summary `json:"ruleChangePerHost"`
	// RuleRequest: the rule's API request alone (the controller's part).
	RuleRequest Summary `json:"ruleRequest"`
	// Revocation: from a rule's delete until the last host concerned
	// applied the rule set without it (a real agent's policy epoch moves
	// on there); RevocationPerHost: each host on its own.
	Revocation        Summary `json:"revocation"`
	RevocationPerHost Summary `json:"revocationPerHost"`
	RevocationRequest Summary `json:"revocationRequest"` // the delete's API request alone
	// RuleHarnessGCs is how many collections of this process's heap (the
	// simulated agents' one shared heap) fell among the rule changes.
	RuleHarnessGCs uint32 `json:"ruleHarnessGCs"`
	// RevocationHarnessGCs is the same among the revocations.
	RevocationHarnessGCs uint32  `json:"revocationHarnessGCs"`
	Move                 Summary `json:"move"`
	// The controller restart: how long the API was away, entries any
	// datapath lost, and relists of desired state, beside an equally
	// long quiet window before it.
	RestartDowntime time.Duration `json:"restartDowntime"`
	RestartRemoved  int64         `json:"restartRemoved"`
	QuietRemoved    int64         `json:"quietRemoved"`
	RestartRelists  int64         `json:"restartRelists"`
	QuietRelists    int64         `json:"quietRelists"`
	// Lists is every full list of desired state by any agent over the
	// run (one each at start, and one after each lost watch).
	Lists int64 `json:"lists"`
	// Reads other than a relist (a farm state, the node records) and
	// watches opened, in the same two windows.
	RestartReads   int64  `json:"restartReads"`
	QuietReads     int64  `json:"quietReads"`
	RestartWatches int64  `json:"restartWatches"`
	QuietWatches   int64  `json:"quietWatches"`
	KilledMember   string `json:"killedMember,omitempty"`
	Converged      bool   `json:"converged"`
	// MinAppliedRevision is the lowest store revision any agent published
	// as applied (AgentStatus.AppliedRevision) once every agent's was at
	// least that of the latest change to a key it follows.
	MinAppliedRevision int64 `json:"minAppliedRevision"`
	EtcdRevision       int64 `json:"etcdRevision"`
	EtcdDB             int64 `json:"etcdDB"`
	EtcdDBInUse        int64 `json:"etcdDBInUse"`
	EtcdDBCompacted    int64 `json:"etcdDBCompacted"`
	// Memory: the controller's own (0 when in this process), the Go heap
	// in use per simulated agent, and this whole process.
	ControllerRSS     int64 `json:"controllerRSS"`
	ControllerPeakRSS int64 `json:"controllerPeakRSS"`
	AgentHeapEach     int64 `json:"agentHeapEach"`
	HarnessRSS        int64 `json:"harnessRSS"`
	// AgentLogBytes and AgentLogLines: what one agent logged, on average.
	AgentLogBytes int64 `json:"agentLogBytes"`
	AgentLogLines int64 `json:"agentLogLines"`
}

// Block is one block of creates.
type Block struct {
	First, Last int           // VM numbers
	Rate        float64       // creates per second over the block
	P50, P99    time.Duration // request latency
	// CPU is the CPU time a create of the block cost this process and
	// the controller's (with -binary): agents, controller, embedded etcd,
	// API client; not an external cluster's members.
	CPU time.Duration
}

// Summary is a distribution's median, 99th percentile and maximum.
type Summary struct {
	N             int
	P50, P99, Max time.Duration
}

func summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return Summary{N: len(s), P50: pct(s, 50), P99: pct(s, 99), Max: s[len(s)-1]}
}

// pct is the p-th percentile of sorted s (nearest rank).
func pct(s []time.Duration, p int) time.Duration {
	i := (len(s)*p + 99) / 100
	return s[max(0, min(len(s)-1, i-1))]
}

// blocks cuts the creates (by VM number) into blocks of n: each block's
// rate is n over the time from the previous block's last answer to its own
// last answer.
func blocks(lat []time.Duration, done []time.Time, start time.Time, n int) []Block {
	var out []Block
	prev := start
	for i := 0; i < len(lat); i += n {
		j := min(len(lat), i+n)
		end := prev
		for _, t := range done[i:j] {
			if t.After(end) {
				end = t
			}
		}
		s := summarize(lat[i:j])
		out = append(out, Block{First: i, Last: j - 1, Rate: float64(j-i) / end.Sub(prev).Seconds(), P50: s.P50, P99: s.P99})
		prev = end
	}
	return out
}

// Target is one of the goals and whether the run met it.
type Target struct {
	What  string
	Met   bool
	Got   string
	phase string
}

func (r *Report) done(phase string) bool {
	for _, p := range r.Done {
		if p == phase {
			return true
		}
	}
	return false
}

// Targets are issue 12's targets, judged on this run (at its size: a
// scaled-down run is judged at its own size).
func (r *Report) Targets() []Target {
	var ts []Target
	defer func() {
		for i := range ts {
			if !r.done(ts[i].phase) {
				ts[i].Met, ts[i].Got = false, "not measured: the run stopped before"
			}
		}
	}()
	ts = append(ts, Target{phase: PhaseCreates, What: fmt.Sprintf("all %d VMs applied on all %d hosts <= 5s after the last create", r.Config.VMs, r.Config.Hosts),
		Met: r.AllAppliedAfterLastCreate <= 5*time.Second, Got: r.AllAppliedAfterLastCreate.Round(time.Millisecond).String()})
	ts = append(ts, Target{phase: PhaseRules, What: "a rule change applied everywhere, p99 <= 100ms",
		Met: r.RuleChange.N > 0 && r.RuleChange.P99 <= 100*time.Millisecond, Got: r.RuleChange.P99.Round(time.Millisecond).String()})
	if r.Config.Revocations > 0 {
		ts = append(ts, Target{phase: PhaseRevocations, What: "a rule revoked, the rule set without it applied on every host concerned, p99 <= 1s",
			Met: r.Revocation.N > 0 && r.Revocation.P99 <= time.Second, Got: r.Revocation.P99.Round(time.Millisecond).String()})
	}
	if len(r.Creates) > 1 {
		f, l := r.Creates[0], r.Creates[len(r.Creates)-1]
		ts = append(ts, Target{phase: PhaseCreates, What: "create rate of the last block >= 0.8x the first",
			Met: l.Rate >= 0.8*f.Rate, Got: fmt.Sprintf("%.0f/s vs %.0f/s (%.2fx)", l.Rate, f.Rate, l.Rate/f.Rate)})
	}
	ts = append(ts, Target{phase: PhaseStore, What: "etcd database < 100 MB at the end", Met: r.EtcdDB < 100e6, Got: mib(r.EtcdDB)})
	ts = append(ts, Target{phase: PhaseRestart, What: "controller restart: no datapath entry removed", Met: r.RestartRemoved == 0,
		Got: fmt.Sprint(r.RestartRemoved)})
	ts = append(ts, Target{phase: PhaseRestart, What: "controller restart: no relist storm (relists <= 1 per agent beyond the quiet window)",
		Met: r.RestartRelists-r.QuietRelists <= int64(r.Config.Hosts),
		Got: fmt.Sprintf("%d in the window vs %d quiet, %d agents", r.RestartRelists, r.QuietRelists, r.Config.Hosts)})
	return ts
}

// Print writes the report as text.
func (r *Report) Print(w io.Writer) {
	c := r.Config
	store := "embedded etcd (in the controller)"
	if c.Cluster > 0 {
		store = fmt.Sprintf("external etcd cluster of %d", c.Cluster)
		if r.KilledMember != "" {
			store += ", leader " + r.KilledMember + " killed at half the creates"
		}
	}
	fmt.Fprintf(w, "\nscale run: %d hosts (real agents, recorder datapaths), %d VMs in %d farms x %d subnets, %s; %v in all\n",
		c.Hosts, c.VMs, c.Farms, c.SubnetsPerFarm, store, r.Elapsed.Round(time.Second))
	if r.Failed != "" {
		fmt.Fprintf(w, "RUN STOPPED EARLY (phases done: %v): %s\n", r.Done, r.Failed)
	}
	fmt.Fprintf(w, "\nVM creates through the REST API (%d client(s) at once):\n", c.APIClients)
	fmt.Fprintf(w, "  %-14s %10s %10s %10s %12s\n", "VMs", "rate/s", "p50", "p99", "CPU/create")
	for _, b := range r.Creates {
		fmt.Fprintf(w, "  %-14s %10.1f %10v %10v %12v\n", fmt.Sprintf("%d-%d", b.First+1, b.Last+1), b.Rate,
			b.P50.Round(10*time.Microsecond), b.P99.Round(10*time.Microsecond), b.CPU.Round(time.Microsecond))
	}
	if n := len(r.Creates); n > 1 && r.Creates[0].CPU > 0 {
		fmt.Fprintf(w, "  CPU a create, last block against the first: %.2fx\n", float64(r.Creates[n-1].CPU)/float64(r.Creates[0].CPU))
	}
	if r.APIRetries > 0 {
		fmt.Fprintf(w, "  (%d creates retried after a 5xx)\n", r.APIRetries)
	}
	fmt.Fprintf(w, "\nall VMs applied on all hosts: %v after the last create\n", r.AllAppliedAfterLastCreate.Round(time.Millisecond))
	fmt.Fprintf(w, "rule change applied everywhere: %s   (per host: %s; the API request alone: %s; %d collections of the agents' shared heap among them)\n",
		r.RuleChange, r.RuleChangePerHost, r.RuleRequest, r.RuleHarnessGCs)
	if r.Revocation.N > 0 {
		fmt.Fprintf(w, "rule revoked, applied everywhere: %s   (per host: %s; the API request alone: %s; %d collections of the agents' shared heap among them); against a rule added in this run: p50 %.2fx, p99 %.2fx (the request alone: p50 %.2fx, p99 %.2fx)\n",
			r.Revocation, r.RevocationPerHost, r.RevocationRequest, r.RevocationHarnessGCs, ratio(r.Revocation.P50, r.RuleChange.P50), ratio(r.Revocation.P99, r.RuleChange.P99),
			ratio(r.RevocationRequest.P50, r.RuleRequest.P50), ratio(r.RevocationRequest.P99, r.RuleRequest.P99))
	}
	fmt.Fprintf(w, "VM move applied on both hosts:  %s\n", r.Move)
	fmt.Fprintf(w, "controller restart: API back in %v; datapath entries removed %d (quiet window %d); relists %d (quiet window %d); other reads %d (%d); watches opened %d (%d)\n",
		r.RestartDowntime.Round(time.Millisecond), r.RestartRemoved, r.QuietRemoved, r.RestartRelists, r.QuietRelists,
		r.RestartReads, r.QuietReads, r.RestartWatches, r.QuietWatches)
	fmt.Fprintf(w, "etcd: revision %d, database %s (%s in use); after compaction and defrag %s\n",
		r.EtcdRevision, mib(r.EtcdDB), mib(r.EtcdDBInUse), mib(r.EtcdDBCompacted))
	ctrl := "in this process (not separable)"
	if r.ControllerRSS > 0 {
		ctrl = fmt.Sprintf("RSS %s (peak %s)", mib(r.ControllerRSS), mib(r.ControllerPeakRSS))
	}
	fmt.Fprintf(w, "memory: controller %s; Go heap per simulated agent %s; this process RSS %s\n", ctrl, kib(r.AgentHeapEach), mib(r.HarnessRSS))
	fmt.Fprintf(w, "full lists of desired state by agents over the run: %d (%d agents)\n", r.Lists, c.Hosts)
	fmt.Fprintf(w, "agent log per agent over the run: %d lines, %s\n", r.AgentLogLines, kib(r.AgentLogBytes))
	fmt.Fprintf(w, "converged: %v (lowest applied revision %d of %d)\n\ntargets:\n", r.Converged, r.MinAppliedRevision, r.EtcdRevision)
	for _, t := range r.Targets() {
		mark := "MISSED"
		if t.Met {
			mark = "met   "
		}
		fmt.Fprintf(w, "  %s %s: %s\n", mark, t.What, t.Got)
	}
}

func (s Summary) String() string {
	if s.N == 0 {
		return "none"
	}
	return fmt.Sprintf("p50 %v p99 %v max %v (n=%d)", s.P50.Round(100*time.Microsecond), s.P99.Round(100*time.Microsecond),
		s.Max.Round(100*time.Microsecond), s.N)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
func kib(b int64) string { return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10)) }

// ratio is a/b, 0 when b is.
func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
