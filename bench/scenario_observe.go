package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/onehop/onehop/internal/lab"
)

// observedLab is onehopLab again, in a lab of its own: an `onehop observe
// --follow` runs against it for the whole run, and none against onehop's.
var observedLab = LabSpec{Name: "benchobs", Datapath: "onehop", Body: onehopLab.Body}

// observedScenario: routed's pair while a stream of every host's events
// runs (issue 23: the 64-byte UDP rate with observe --follow at least
// 0.95x the rate without). Between subnets, so that each test's new flow
// is admitted by a rule and published, on both hosts (inside one subnet
// without firewalls a flow takes no conntrack entry and publishes
// nothing). The datapath's own per-packet cost of events, off and on, is
// BenchmarkPrivilegedObserveCost (internal/datapath).
var observedScenario = &Scenario{
	Name:        "observed",
	Description: "lab " + observedLab.Name + ": vm1 (net) on h1 -> vm3 (net2) on h2 as in routed, while `onehop observe --follow` streams every host's events",
	Tests:       []string{"rtt", "udp64"},
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := e.Lab(ctx, observedLab)
		if err != nil {
			return nil, err
		}
		if err := e.Once("observe "+l.Name, func() error { return startObserve(ctx, e, l) }); err != nil {
			return nil, err
		}
		p, err := l.Pair("vm1", "vm3")
		return []*Pair{p}, err
	},
	Baselines: []Baseline{
		{Scenario: "routed", Targets: map[string]Target{"udp64": {Ratio: 0.95}}},
	},
}

// startObserve runs `onehop observe --follow -o json` against l until the
// bench ends, its events counted and thrown away, and waits until it
// streams.
func startObserve(ctx context.Context, e *Env, l *Lab) error {
	st, err := lab.Load(e.cfg.root, l.Name)
	if err != nil {
		return err
	}
	cmd := e.onehop(context.Background(), "observe", "--follow", "-o", "json", "--api", st.APISocket)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("onehop observe: %w", err)
	}
	var events atomic.Int64
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			events.Add(1)
		}
	}()
	e.OnCleanup(func() error {
		cmd.Cancel() //nolint:errcheck // gone already is fine
		cmd.Wait()   //nolint:errcheck // ended by us
		progress("observed: the stream showed %d events", events.Load())
		return nil
	})
	started := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		var said []string
		for sc.Scan() {
			if sc.Text() == "observing" {
				started <- nil
				io.Copy(io.Discard, stderr) //nolint:errcheck // drained
				return
			}
			said = append(said, sc.Text())
		}
		started <- fmt.Errorf("onehop observe ended before it streamed: %s", strings.Join(said, "; "))
	}()
	select {
	case err := <-started:
		return err
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(30 * time.Second):
		return fmt.Errorf("onehop observe: not streaming after 30 s")
	}
}
