package bpftest

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// Result is what one run of a program did.
type Result struct {
	Verdict uint32
	Out     []byte // the frame as the program left it
	// To and Kind say where and how the frame itself was redirected (To 0:
	// it was not).
	To   uint32
	Kind RedirectKind
	// Clones are the ifindexes copies were sent out of, in order; ClonesIn
	// those copies were sent into (a macvtap guest's vif).
	Clones   []uint32
	ClonesIn []uint32
}

// Run runs prog (a test object) once on in with BPF_PROG_RUN, its
// redirect log emptied first. It fails t when the run cannot be made, or
// when it redirected the frame itself more than once.
func Run(t testing.TB, prog *ebpf.Program, in []byte) Result {
	t.Helper()
	return RunWith(t, prog, in, nil)
}

// RunWith is Run with the run made inside do (nil: here): netns.Do for a
// run in the namespace that holds the devices its copies are sent to,
// since bpf_clone_redirect sends at once.
func RunWith(t testing.TB, prog *ebpf.Program, in []byte, do func(func() error) error) Result {
	t.Helper()
	return run(t, prog, OpenRedirectLog(t, prog), in, do)
}

func run(t testing.TB, prog *ebpf.Program, log *RedirectLog, in []byte, do func(func() error) error) Result {
	t.Helper()
	if do == nil {
		do = func(f func() error) error { return f() }
	}
	log.Reset(t)
	var r Result
	err := do(func() error {
		opts := &ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+256)}
		ret, err := prog.Run(opts)
		if err != nil {
			return fmt.Errorf("BPF_PROG_RUN: %w", err)
		}
		r.Verdict, r.Out = ret, opts.DataOut
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	redirected := false
	for _, e := range log.Read(t) {
		if e.Kind == RedirectClone {
			r.Clones = append(r.Clones, e.Ifindex)
			continue
		}
		if e.Kind == RedirectCloneIn {
			r.ClonesIn = append(r.ClonesIn, e.Ifindex)
			continue
		}
		if redirected {
			t.Fatalf("redirected twice in one run: to %d (%s) and %d (%s)", r.To, r.Kind, e.Ifindex, e.Kind)
		}
		redirected = true
		r.To, r.Kind = e.Ifindex, e.Kind
	}
	return r
}

// Row is one row of a BPF_PROG_RUN table: a frame in, and all that must
// come of it.
type Row struct {
	Name    string
	Prog    *ebpf.Program
	In      []byte
	Verdict uint32
	// To and Kind say where a redirect row's frame goes and how (every
	// redirect row says); a row of another verdict redirects nothing.
	To   uint32
	Kind RedirectKind
	// Clones lists the ifindexes copies go out of, in order; ClonesIn
	// those copies go into (REDIRECT_CLONE_IN); nil: none.
	Clones   []uint32
	ClonesIn []uint32
	// Out is the whole frame out; nil: not compared.
	Out []byte
	// Check checks more of the frame out; nil: nothing more.
	Check func(t *testing.T, out []byte)
	// Counters are the counters that rise, and by how much: every other
	// counter the table reads stays as it was.
	Counters Counters
}

// RunTable runs each row as a subtest of t, in order (a row may depend on
// the state the rows before it left): the run, its verdict, where the
// frame and its copies went, the frame out, and the delta of every counter
// that counters reads before and after the row (nil: none).
func RunTable(t *testing.T, counters func(testing.TB) Counters, rows []Row) {
	t.Helper()
	read := func(t testing.TB) Counters {
		if counters == nil {
			return nil
		}
		return counters(t)
	}
	logs := map[*ebpf.Program]*RedirectLog{}
	for _, r := range rows {
		if logs[r.Prog] == nil {
			logs[r.Prog] = OpenRedirectLog(t, r.Prog)
		}
	}
	for _, r := range rows {
		t.Run(r.Name, func(t *testing.T) {
			if r.Verdict == ActRedirect && (r.To == 0 || r.Kind == RedirectNone) {
				t.Fatal("a redirect row must say where the frame goes, and how (To, Kind)")
			}
			before := read(t)
			got := run(t, r.Prog, logs[r.Prog], r.In, nil)
			if got.Verdict != r.Verdict {
				t.Fatalf("verdict %d, want %d", got.Verdict, r.Verdict)
			}
			if !slices.Equal(got.Clones, r.Clones) {
				t.Errorf("copies sent to ifindexes %v, want %v", got.Clones, r.Clones)
			}
			if !slices.Equal(got.ClonesIn, r.ClonesIn) {
				t.Errorf("copies sent into ifindexes %v, want %v", got.ClonesIn, r.ClonesIn)
			}
			if r.Verdict == ActRedirect {
				if got.To != r.To || got.Kind != r.Kind {
					t.Errorf("redirected to ifindex %d (%s), want %d (%s)", got.To, got.Kind, r.To, r.Kind)
				}
			} else if got.To != 0 {
				t.Errorf("verdict %d, but the run redirected to ifindex %d (%s)", got.Verdict, got.To, got.Kind)
			}
			if r.Out != nil && !bytes.Equal(got.Out, r.Out) {
				t.Errorf("output frame\n got %x\nwant %x", got.Out, r.Out)
			}
			if r.Check != nil {
				r.Check(t, got.Out)
			}
			if counters != nil {
				CheckDelta(t, before, read(t), r.Counters)
			}
		})
	}
}

// Counters are counter values by name, read before and after a run; a
// table names them as it likes ("drop malformed", "s1 in").
type Counters map[string]uint64

// Add puts every counter of m into c as "prefix name", and returns c.
func (c Counters) Add(prefix string, m map[string]uint64) Counters {
	for name, v := range m {
		c[prefix+" "+name] = v
	}
	return c
}

// CheckDelta fails t unless every counter rose from before to after by
// what want says (0 where it says nothing), and every counter want names
// exists.
func CheckDelta(t testing.TB, before, after, want Counters) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(after)) {
		if d := after[name] - before[name]; d != want[name] {
			t.Errorf("counter %s rose by %d, want %d", name, d, want[name])
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if _, ok := after[name]; !ok {
			t.Errorf("no counter %s", name)
		}
	}
}

// PacketCost is what prog takes per packet in ns, timed by the kernel over
// n runs on in, one packet a run: a repeated run would see the frame its
// last run rewrote (and time a drop), and the kernel times each run on its
// own, so the syscall around it is not counted. Every run must return want,
// or it would time something else. do is as for RunWith.
func PacketCost(t testing.TB, prog *ebpf.Program, in []byte, n int, want uint32, do func(func() error) error) float64 {
	t.Helper()
	if do == nil {
		do = func(f func() error) error { return f() }
	}
	var total time.Duration
	err := do(func() error {
		for i := 0; i < n; i++ {
			ret, d, err := prog.Benchmark(in, 1, nil)
			if err != nil {
				return fmt.Errorf("BPF_PROG_RUN: %w", err)
			}
			if ret != want {
				return fmt.Errorf("verdict %d, want %d: this would time something else", ret, want)
			}
			total += d
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return float64(total.Nanoseconds()) / float64(n)
}
