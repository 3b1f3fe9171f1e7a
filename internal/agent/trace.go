package agent

import (
	"context"
	"encoding/json"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/trace"
)

// Tracer is what a Datapath that can run `onehop trace` also has: the
// kernel's trace instance of its programs (internal/datapath/trace.go).
type Tracer interface {
	Trace(r trace.AgentRequest) (trace.Run, error)
}

// serveTraces answers the controller's trace requests for this host
// (intent.TraceRequestsPrefix) until ctx ends. Only requests made while it
// watches are answered: an older one's asker has given up.
func (a *Agent) serveTraces(ctx context.Context) {
	prefix := intent.TraceRequestsPrefix + a.cfg.Node + "/"
	for ctx.Err() == nil {
		_, rev, err := a.store.List(ctx, prefix)
		if err == nil {
			for b := range a.store.WatchEvents(ctx, prefix, rev) {
				if b.Err != nil {
					break
				}
				for _, ev := range b.Events {
					if !ev.Deleted {
						a.answerTrace(ctx, ev.Value)
					}
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (a *Agent) answerTrace(ctx context.Context, raw []byte) {
	var req trace.AgentRequest
	reply := trace.AgentReply{Node: a.cfg.Node}
	if err := json.Unmarshal(raw, &req); err != nil {
		a.log.Warn("trace request unreadable", "err", err)
		return
	}
	reply.ID = req.ID
	if t, ok := a.dp.(Tracer); !ok {
		reply.Error = "host " + a.cfg.Node + ": its datapath cannot trace"
	} else if run, err := t.Trace(req); err != nil {
		reply.Error = "host " + a.cfg.Node + ": " + err.Error()
	} else {
		reply.Run = &run
	}
	if err := store.PutJSON(ctx, a.store, intent.TraceReplyKey(a.cfg.Node), reply); err != nil {
		a.log.Warn("trace reply not written", "id", req.ID, "err", err)
	}
}
