package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/trace"
)

// Issue 23: `onehop trace` latency on a two-host path, target p99 <= 200 ms.
// In onehopLab, vm1 (h1, bench/net) -> vm3 (h2, bench/net2), tcp/80: the
// controller asks h1's agent to run its vif program, follows the frame to
// h2 and asks h2's agent to run its uplink program, each through the store
// (a request written and an answer watched). The baseline, interleaved in
// the same run, is a plain read of the same API over the same socket
// (GET /v1/farms/bench/vms): what a trace adds is the two hosts' round
// trips through etcd and their BPF_PROG_RUN.
const traceSamples = 200

// traceTargetP99 is the target, in ms.
const traceTargetP99 = 200

var traceScenario = &Scenario{
	Name:        "trace",
	Description: "onehop trace latency, vm1 on h1 -> vm3 on h2 (two hosts), against a plain API read in the same run",
	Tests:       []string{}, // its figures are its checks
	Build:       func(context.Context, *Env) ([]*Pair, error) { return nil, nil },
	Checks:      traceChecks,
}

func traceChecks(ctx context.Context, e *Env, _ []*Pair) ([]Check, error) {
	l, err := e.Lab(ctx, onehopLab)
	if err != nil {
		return nil, err
	}
	st, err := lab.Load(e.cfg.root, l.Name)
	if err != nil {
		return nil, err
	}
	vm3, err := l.Addr("vm3")
	if err != nil {
		return nil, err
	}
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", st.APISocket)
	}}}
	get := func(path string, out any) error {
		req, err := http.NewRequestWithContext(ctx, "GET", "http://onehop"+path, nil)
		if err != nil {
			return err
		}
		resp, err := cl.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		if out != nil {
			return json.Unmarshal(b, out)
		}
		return nil
	}
	q := url.Values{"from": {"bench/net/vm1"}, "to": {"bench/net2/vm3"}, "proto": {"tcp"}, "dport": {"80"}}
	tracePath := "/v1/trace?" + q.Encode()
	// h1 learns where vm3 lives from a real packet; until then a trace
	// ends at h1 (held), a one-host path.
	if out, err := e.inLab(l.Name, "vm1")(ctx, "ping", "-c", "2", "-W", "1", vm3).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("vm1 ping vm3: %v\n%s", err, out)
	}
	var rep trace.Report
	for deadline := time.Now().Add(10 * time.Second); ; {
		if err := get(tracePath, &rep); err != nil {
			return nil, err
		}
		if rep.Verdict == "delivered" && len(rep.Hops) == 2 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("trace vm1 -> vm3: %s over %d hops, want delivered over h1 and h2", rep.Verdict, len(rep.Hops))
		}
		time.Sleep(200 * time.Millisecond)
	}
	var traces, reads []float64
	for i := 0; i < traceSamples; i++ {
		start := time.Now()
		if err := get(tracePath, &rep); err != nil {
			return nil, err
		}
		traces = append(traces, float64(time.Since(start).Microseconds())/1000)
		if rep.Verdict != "delivered" || len(rep.Hops) != 2 {
			return nil, fmt.Errorf("trace %d: %s over %d hops", i, rep.Verdict, len(rep.Hops))
		}
		start = time.Now()
		if err := get("/v1/farms/bench/vms", nil); err != nil {
			return nil, err
		}
		reads = append(reads, float64(time.Since(start).Microseconds())/1000)
	}
	t, r := Summarize(traces), Summarize(reads)
	p99 := Percentile(traces, 99)
	progress("trace: vm1 -> vm3 p50 %.1f ms p99 %.1f ms; API read p50 %.2f ms", t.Median, p99, r.Median)
	detail := fmt.Sprintf("%d traces bench/net/vm1 (h1) -> bench/net2/vm3 (h2) tcp/80 over the API's unix socket: p50 %.1f p99 %.1f ms (min %.1f, max %.1f); "+
		"interleaved plain reads (GET /v1/farms/bench/vms): p50 %.2f p99 %.2f ms", len(traces), t.Median, p99, t.Min, t.Max, r.Median, Percentile(reads, 99))
	return []Check{
		{Scenario: "trace", Name: "two-host trace, p99", Value: round3(p99), Unit: "ms", Op: "<=", Target: traceTargetP99, Met: ptr(p99 <= traceTargetP99), Detail: detail},
		{Scenario: "trace", Name: "two-host trace, p50", Value: round3(t.Median), Unit: "ms", Detail: detail},
		{Scenario: "trace", Name: "two-host trace over a plain API read, p50", Value: round3(t.Median / r.Median), Unit: "x", Detail: detail},
	}, nil
}
