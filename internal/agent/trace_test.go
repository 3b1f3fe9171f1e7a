package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/testenv"
	"github.com/onehop/onehop/internal/trace"
)

// tracingDatapath is the fake datapath with a trace instance that says
// what it was asked.
type tracingDatapath struct{ fakeDatapath }

func (*tracingDatapath) Trace(r trace.AgentRequest) (trace.Run, error) {
	if r.Program != trace.ProgramVif {
		return trace.Run{}, fmt.Errorf("program %q", r.Program)
	}
	return trace.Run{Program: r.Program, Verdict: "drop", Drop: "not_visible", Out: r.Frame}, nil
}

// ask writes req for h1 until h1's agent answers it (it answers requests
// made while it watches, and may not watch yet), and returns the answer.
func ask(t *testing.T, s store.Store, req trace.AgentRequest) trace.AgentReply {
	t.Helper()
	b, _ := json.Marshal(req)
	var rep trace.AgentReply
	testenv.Eventually(t, "h1 answers trace "+req.ID, 5*time.Second, func() error {
		if err := s.Put(t.Context(), intent.TraceRequestKey("h1"), b); err != nil {
			return err
		}
		if err := store.GetJSON(t.Context(), s, intent.TraceReplyKey("h1"), &rep); err != nil {
			return err
		}
		if rep.ID != req.ID {
			return fmt.Errorf("last answer is to %q", rep.ID)
		}
		return nil
	})
	return rep
}

// The agent answers each trace request for its host with its datapath's
// run, or with the error that stopped it, naming the host; a datapath
// that cannot trace says so.
func TestAgentAnswersTraceRequestsForItsHost(t *testing.T) {
	for _, c := range []struct {
		name string
		dp   Datapath
		req  trace.AgentRequest
		want string // the error; "" for a run
	}{
		{"run", &tracingDatapath{}, trace.AgentRequest{ID: "a1", Program: trace.ProgramVif, Frame: []byte{1, 2}}, ""},
		{"error", &tracingDatapath{}, trace.AgentRequest{ID: "a2", Program: "egress"}, `host h1: program "egress"`},
		{"no trace", &fakeDatapath{}, trace.AgentRequest{ID: "a3", Program: trace.ProgramVif}, "host h1: its datapath cannot trace"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := store.NewMemory()
			a := newAgent(t, s, c.dp, fakeInterfaces{"uplink0": 2})
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() { defer close(done); a.serveTraces(ctx) }()
			t.Cleanup(func() { cancel(); <-done })
			rep := ask(t, s, c.req)
			if rep.Node != "h1" || rep.Error != c.want || (c.want == "") != (rep.Run != nil) {
				t.Errorf("answer %+v, want error %q", rep, c.want)
			}
			if c.want == "" && (rep.Run.Drop != "not_visible" || string(rep.Run.Out) != string(c.req.Frame)) {
				t.Errorf("run %s", rep.Run)
			}
		})
	}
}
