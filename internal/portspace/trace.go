package portspace

import (
	"errors"
	"fmt"
	"sync"

	"github.com/onehop/onehop/internal/bpfobj"
	"github.com/onehop/onehop/internal/limits"
	"github.com/onehop/onehop/internal/trace"
)

// tracer is the trace instance of the sliver program (bpf/lib/trace.h):
// the same object loaded with trace_mode set, on the router's live maps,
// so a run reads port space's state (leases, echo ids, fragment records,
// shares) and writes none of it. Loaded on the first sliver trace and kept.
type tracer struct {
	once sync.Once
	objs portspaceObjects
	err  error
}

// load loads the trace instance on the router's maps.
func (t *tracer) load(k *Kernel) error {
	t.once.Do(func() {
		spec, err := loadPortspace()
		if err != nil {
			t.err = err
			return
		}
		v, ok := spec.Variables["trace_mode"]
		if !ok {
			t.err = errors.New("trace: the sliver object has no trace_mode (built before bpf/lib/trace.h?)")
			return
		}
		if err := v.Set(uint8(1)); err != nil {
			t.err = fmt.Errorf("trace: set trace_mode: %w", err)
			return
		}
		// Every pinned map is the live one; trace_steps is the instance's own.
		if t.err = bpfobj.LoadOn(spec, &t.objs, k.router.Maps(), "sliver trace", "vif"); t.err == nil {
			k.router.CloseWith(&t.objs)
		}
	})
	return t.err
}

// Trace runs the sliver program's trace instance on r.Frame as if sliver
// r.Sliver sent it on its link on uplink r.Uplink: what port space would
// do with it (confined, sent out of the uplink, to another sliver or the
// host on the shared address, or dropped with the reason a real frame is
// counted for). Nothing in the maps changes.
func (k *Kernel) Trace(r trace.AgentRequest) (trace.Run, error) {
	if r.Program != trace.ProgramSliver {
		return trace.Run{}, fmt.Errorf("trace: program %q: port space runs %s", r.Program, trace.ProgramSliver)
	}
	if r.Uplink < 0 || r.Uplink >= limits.MaxUplinks {
		return trace.Run{}, fmt.Errorf("trace: uplink %d: want 0..%d", r.Uplink, limits.MaxUplinks-1)
	}
	var s sliverRecord
	if err := k.objs.PortspaceSlivers.Lookup(r.Sliver, &s); err != nil || s.Vif[r.Uplink] == 0 {
		return trace.Run{}, fmt.Errorf("trace: sliver slot %d has no link on uplink %d on this host (is it synced yet?)", r.Sliver, r.Uplink)
	}
	if err := k.trace.load(k); err != nil {
		return trace.Run{}, err
	}
	return k.router.RunTrace(r.Program, k.trace.objs.SliverIngress, k.trace.objs.TraceSteps, s.Vif[r.Uplink], r.Frame)
}
