package scale

import (
	"bytes"
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
)

// small is the short run make test does: seconds, and correctness only.
func small(t *testing.T) Config {
	return Config{Hosts: 20, VMs: 200, Farms: 4, SubnetsPerFarm: 2, RuleChanges: 4, Revocations: 6, Moves: 4, Block: 50,
		Resync: 300 * time.Millisecond, Wait: 30 * time.Second, Dir: t.TempDir()}
}

// check fails t on what must hold whatever the timings: every agent
// converged on every VM and rule (Run checks it and errs otherwise), no
// VM's entry left any datapath across the controller restart, and the
// report has the figures the bench prints.
func check(t *testing.T, r *Report, err error, progress *bytes.Buffer) {
	t.Helper()
	if err != nil {
		t.Fatalf("scale run: %v\nprogress:\n%s", err, progress)
	}
	if !r.Converged {
		t.Errorf("run ended without every agent converged")
	}
	if r.RestartRemoved != 0 {
		t.Errorf("controller restart took %d entries out of datapaths; want none", r.RestartRemoved)
	}
	if len(r.Creates) != r.Config.VMs/r.Config.Block || r.RuleChange.N != r.Config.RuleChanges || r.Move.N != r.Config.Moves ||
		r.Revocation.N != r.Config.Revocations {
		t.Errorf("report lacks figures: %d create blocks, %d rule changes, %d revocations, %d moves", len(r.Creates), r.RuleChange.N, r.Revocation.N, r.Move.N)
	}
	if r.EtcdDB <= 0 || r.EtcdDBCompacted <= 0 {
		t.Errorf("store figures missing: db %d, compacted %d", r.EtcdDB, r.EtcdDBCompacted)
	}
	if r.MinAppliedRevision <= 0 {
		t.Errorf("an agent published no applied revision (AgentStatus.AppliedRevision)")
	}
	// Each agent lists its desired keys once at start; with its watches
	// unbroken it never lists again. Fewer lists than agents means the
	// count no longer sees how the agent reads (countingStore).
	if r.Lists < int64(r.Config.Hosts) {
		t.Errorf("%d full lists of desired state by %d agents: countingStore (recorder.go) no longer sees the agent's list", r.Lists, r.Config.Hosts)
	}
	if r.QuietRelists != 0 {
		t.Errorf("%d relists while nothing changed; want none", r.QuietRelists)
	}
	var out bytes.Buffer
	r.Print(&out)
	t.Logf("%s", out.String())
}

func TestScaleEveryAgentConvergesAndAControllerRestartRemovesNothing(t *testing.T) {
	cfg := small(t)
	var progress bytes.Buffer
	cfg.Progress = &progress
	r, err := Run(context.Background(), cfg)
	check(t, r, err, &progress)
}

func TestScaleExternalClusterLosesNoIntentWhenItsLeaderIsKilled(t *testing.T) {
	testenv.RequireTool(t, "etcd")
	etcd, _ := exec.LookPath("etcd")
	cfg := small(t)
	cfg.Cluster, cfg.EtcdBinary, cfg.KillMember = 3, etcd, true
	var progress bytes.Buffer
	cfg.Progress = &progress
	r, err := Run(context.Background(), cfg)
	check(t, r, err, &progress)
	if r != nil && r.KilledMember == "" {
		t.Errorf("no member was killed")
	}
}
