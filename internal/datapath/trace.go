package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/onehop/onehop/internal/bpfobj"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/trace"
)

// tracer is the trace instance of the programs (bpf/lib/trace.h): the same
// objects loaded with trace_mode set, on k's maps, so a run reads the live
// state and writes none of it. Loaded on the first trace and kept: a load
// is the verifier's work, a run is microseconds.
type tracer struct {
	mu     sync.Mutex // one run at a time: they share one record
	vif    vifObjects
	uplink uplinkObjects
	names  traceNames
}

// traceNames name the datapath's enums as the metrics do.
type traceNames struct {
	drop, fwd, slow, redirect, ct []string
}

// loadTracer loads the trace instance on k's maps.
func (k *Kernel) loadTracer() (*tracer, error) {
	t := &tracer{}
	vspec, err := loadVif()
	if err != nil {
		return nil, err
	}
	uspec, err := loadUplink()
	if err != nil {
		return nil, err
	}
	for _, spec := range []*ebpf.CollectionSpec{vspec, uspec} {
		v, ok := spec.Variables["trace_mode"]
		if !ok {
			return nil, errors.New("trace: the datapath objects have no trace_mode (built before bpf/lib/trace.h?)")
		}
		if err := v.Set(uint8(1)); err != nil {
			return nil, fmt.Errorf("trace: set trace_mode: %w", err)
		}
	}
	for _, e := range []struct {
		names  *[]string
		typ    string
		prefix string
	}{
		{&t.names.drop, "drop_reason", "DROP_"}, {&t.names.fwd, "forward_path", "FWD_"},
		{&t.names.slow, "slowpath_kind", "SLOW_"}, {&t.names.redirect, "redirect_kind", "REDIRECT_"},
		{&t.names.ct, "trace_ct", "TRACE_CT_"},
	} {
		if *e.names, err = bpfobj.EnumNames(vspec, e.typ, e.prefix); err != nil {
			return nil, err
		}
	}
	// Every pinned map is the live one; trace_steps and .rodata are the
	// instance's own (LoadOn shares pinned maps only).
	if err := bpfobj.LoadOn(vspec, &t.vif, k.maps, "vif trace", "vif"); err != nil {
		return nil, err
	}
	if err := bpfobj.LoadOn(uspec, &t.uplink, k.maps, "uplink trace", "vif"); err != nil {
		t.vif.Close()
		return nil, err
	}
	return t, nil
}

func (t *tracer) Close() error {
	t.uplink.Close()
	return t.vif.Close()
}

// loadedTracer is the trace instance, loaded on the first trace.
func (k *Kernel) loadedTracer() (*tracer, error) {
	k.traceOnce.Do(func() {
		k.tracer, k.traceErr = k.loadTracer()
		if k.tracer != nil {
			k.CloseWith(k.tracer)
		}
	})
	return k.tracer, k.traceErr
}

// TraceFunc runs one program of a feature's trace instance (one loaded
// with trace_mode set, on this host's maps) for a trace.AgentRequest.
type TraceFunc func(trace.AgentRequest) (trace.Run, error)

// TraceWith has Trace hand requests for program to run: a feature whose
// programs live in its own package (port space's sliver program) traces
// them through the same agent request as the router's.
func (k *Kernel) TraceWith(program string, run TraceFunc) {
	k.traceMu.Lock()
	defer k.traceMu.Unlock()
	if k.traceFeatures == nil {
		k.traceFeatures = map[string]TraceFunc{}
	}
	k.traceFeatures[program] = run
}

// Trace runs one program of the trace instance on r.Frame against this
// host's live maps and says what it decided. Nothing in the maps changes
// (bpf/lib/trace.h); BPF_PROG_RUN performs no redirect, and the trace
// instance sends no copy. The vif program runs as if the frame came in on
// the vif of r.Src, the uplink program as if it came in on the uplink; a
// feature's program (TraceWith) as that feature says.
func (k *Kernel) Trace(r trace.AgentRequest) (trace.Run, error) {
	k.traceMu.Lock()
	feature := k.traceFeatures[r.Program]
	k.traceMu.Unlock()
	if feature != nil {
		return feature(r)
	}
	t, err := k.loadedTracer()
	if err != nil {
		return trace.Run{}, err
	}
	var prog *ebpf.Program
	var steps *ebpf.Map
	var ifindex uint32
	switch r.Program {
	case trace.ProgramVif:
		src, err := netip.ParseAddr(r.Src)
		if err != nil {
			return trace.Run{}, fmt.Errorf("trace: src %q: %w", r.Src, err)
		}
		if ifindex, err = k.vifOf(src); err != nil {
			return trace.Run{}, err
		}
		prog, steps = t.vif.VifIngress, t.vif.TraceSteps
	case trace.ProgramUplink:
		var cfg NodeConfig
		if err := k.vif.Config.Lookup(uint32(0), &cfg); err != nil {
			return trace.Run{}, fmt.Errorf("trace: read config: %w", err)
		}
		if cfg.UplinkIfindex == 0 {
			return trace.Run{}, errors.New("trace: this host's uplink is not configured yet")
		}
		// On the uplink the frame arrives by: port space finds the
		// uplink's public address by the device.
		ifindex = cfg.UplinkIfindex
		if r.Uplink != 0 {
			var up uplinkPortspaceUplink
			m := k.maps["portspace_uplink_index"]
			if m == nil || m.Lookup(uint32(r.Uplink), &up) != nil || up.Ifindex == 0 {
				return trace.Run{}, fmt.Errorf("trace: this host has no uplink %d", r.Uplink)
			}
			ifindex = up.Ifindex
		}
		if _, err := net.InterfaceByIndex(int(ifindex)); err != nil {
			// No such device in this namespace (a test's made-up
			// uplink): only port space reads the device, and it has
			// nothing to steer for one that does not exist.
			ifindex = 0
		}
		prog, steps = t.uplink.UplinkIngress, t.uplink.TraceSteps
	default:
		return trace.Run{}, fmt.Errorf("trace: program %q: this host has no such program (want %s or %s)", r.Program, trace.ProgramVif, trace.ProgramUplink)
	}
	return k.RunTrace(r.Program, prog, steps, ifindex, r.Frame)
}

// RunTrace runs prog, a program of a trace instance whose record map is
// steps, on frame as if it came in on ifindex (0: loopback), and says what
// it decided, named as the router's own runs are.
func (k *Kernel) RunTrace(program string, prog *ebpf.Program, steps *ebpf.Map, ifindex uint32, frame []byte) (trace.Run, error) {
	t, err := k.loadedTracer()
	if err != nil {
		return trace.Run{}, err
	}
	if len(frame) < 14 {
		return trace.Run{}, fmt.Errorf("trace: frame of %d bytes: shorter than an Ethernet header", len(frame))
	}

	t.mu.Lock()
	defer t.mu.Unlock()
	// runs marks the record as this run's: a record left at zero would
	// read as "passed, decided nothing".
	if err := steps.Put(uint32(0), TraceRecord{Runs: 1}); err != nil {
		return trace.Run{}, fmt.Errorf("trace: reset record: %w", err)
	}
	out := make([]byte, len(frame)+256)
	opts := &ebpf.RunOptions{Data: frame, DataOut: out}
	if ifindex > 1 {
		// struct __sk_buff up to ifindex (offset 40): BPF_PROG_RUN sets
		// the skb's device from it, so skb->ifindex is the vif's, as on
		// the wire. (1, loopback, is its default and may not be given.)
		ctx := make([]byte, 44)
		binary.NativeEndian.PutUint32(ctx[40:], ifindex)
		opts.Context = ctx
	}
	ret, err := prog.Run(opts)
	if err != nil {
		return trace.Run{}, fmt.Errorf("trace: BPF_PROG_RUN on ifindex %d: %w", ifindex, err)
	}
	var rec TraceRecord
	if err := steps.Lookup(uint32(0), &rec); err != nil {
		return trace.Run{}, fmt.Errorf("trace: read record: %w", err)
	}
	return t.names.explain(program, ret, rec, opts.DataOut), nil
}

// TraceRecord is one trace run's record (struct trace_record).
type TraceRecord = vifTraceRecord

// tc verdicts (linux/pkt_cls.h).
const (
	tcActOK       = 0
	tcActShot     = 2
	tcActStolen   = 4
	tcActRedirect = 7
)

func (n traceNames) explain(program string, ret uint32, rec TraceRecord, out []byte) trace.Run {
	run := trace.Run{Program: program, Out: out}
	switch ret {
	case tcActShot, tcActStolen:
		run.Verdict = "drop"
	case tcActRedirect:
		run.Verdict = "redirect"
	case tcActOK:
		run.Verdict = "pass"
	default:
		run.Verdict = fmt.Sprintf("tc verdict %d", ret)
	}
	if rec.Drop != 0 {
		run.Drop = name(n.drop, rec.Drop)
	}
	for i := uint32(0); i < 32; i++ {
		if rec.Forward&(1<<i) != 0 {
			run.Forwards = append(run.Forwards, name(n.fwd, i))
		}
	}
	if rec.ToIfindex != 0 {
		run.To, run.ToKind = int(rec.ToIfindex), name(n.redirect, rec.ToKind)
		if ifi, err := net.InterfaceByIndex(int(rec.ToIfindex)); err == nil {
			run.ToName = ifi.Name
		}
	}
	if rec.Slow != 0 {
		run.Slow = name(n.slow, rec.Slow-1)
		if run.Verdict == "drop" && rec.Drop == 0 {
			run.Verdict = "to agent"
		}
	}
	run.Ask = rec.Ask != 0
	if rec.Ct != 0 {
		run.Conntrack = name(n.ct, uint32(rec.Ct))
	}
	if rec.SrcFarm != 0 || rec.Vis != 0 {
		run.Visibility = &trace.VisHit{
			VisRule: intent.VisRule{SrcFarm: rec.SrcFarm, SrcSubnet: rec.SrcSubnet, DstFarm: rec.DstFarm, DstSubnet: rec.DstSubnet,
				Proto: rec.VisProto, Port: rec.VisPort},
			Gen: rec.VisGen, Match: []string{"", "port", "proto", "any"}[rec.Vis&3],
		}
	}
	for dir, d := range []string{"in", "out"} {
		how := rec.Fw[dir]
		if how == 0 {
			continue
		}
		run.Firewall = append(run.Firewall, trace.FwHit{
			Dir: d, How: []string{"", "rule", "default", "missing"}[how&3],
			Index: int(rec.FwIndex[dir]), Allow: rec.FwAllow[dir] != 0,
		})
	}
	if run.Verdict != "redirect" && run.Verdict != "pass" {
		run.Out = nil
	}
	return run
}

func name(names []string, i uint32) string {
	if int(i) < len(names) && names[i] != "" {
		return names[i]
	}
	return fmt.Sprintf("#%d", i)
}

// vifOf is the ifindex of the vif of the local VM at ip.
func (k *Kernel) vifOf(ip netip.Addr) (uint32, error) {
	want := IPKey(ip)
	var key uint32
	var v VifInfo
	it := k.vif.Vifs.Iterate()
	for it.Next(&key, &v) {
		if v.Ip == want {
			return key, nil
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("trace: read vifs: %w", err)
	}
	return 0, fmt.Errorf("trace: no vif of %s on this host", ip)
}
