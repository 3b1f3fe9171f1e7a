package bpftest

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
)

// MapSnapshot is every entry of every map in maps that a packet can write
// (ring buffers are checked by reading them: RingEmpty), as text, by map
// name: two snapshots differ exactly where an entry changed.
func MapSnapshot(t testing.TB, maps map[string]*ebpf.Map) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, m := range maps {
		switch m.Type() {
		case ebpf.RingBuf, ebpf.ProgramArray, ebpf.ArrayOfMaps, ebpf.HashOfMaps:
			continue
		}
		var key []byte
		var entries []string
		it := m.Iterate()
		if m.Type() == ebpf.PerCPUArray || m.Type() == ebpf.PerCPUHash || m.Type() == ebpf.LRUCPUHash {
			var vals [][]byte
			for it.Next(&key, &vals) {
				entries = append(entries, fmt.Sprintf("%x=%x", key, vals))
			}
		} else {
			var val []byte
			for it.Next(&key, &val) {
				entries = append(entries, fmt.Sprintf("%x=%x", key, val))
			}
		}
		if err := it.Err(); err != nil {
			t.Fatalf("read map %s: %v", name, err)
		}
		slices.Sort(entries)
		out[name] = fmt.Sprint(entries)
	}
	return out
}

// SameSnapshots fails t for every map whose entries differ between before
// and after (why: what changed them).
func SameSnapshots(t testing.TB, before, after map[string]string, why string) {
	t.Helper()
	for name := range before {
		if before[name] != after[name] {
			t.Errorf("map %s changed under %s:\nbefore %s\nafter  %s", name, why, before[name], after[name])
		}
	}
}

// RingEmpty fails t if the ring buffer m holds a record.
func RingEmpty(t testing.TB, m *ebpf.Map, what string) {
	t.Helper()
	r, err := ringbuf.NewReader(m)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.SetDeadline(time.Now())
	if rec, err := r.Read(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("%s ring buffer: want nothing, got a record of %d bytes (err %v)", what, len(rec.RawSample), err)
	}
}

// MovedOnce fails t unless, of the counters in after (kind: "drop",
// "forward"), exactly those named in want rose by one from before, and no
// other moved: a real packet counted where a trace said it would be.
func MovedOnce(t testing.TB, what, kind string, before, after map[string]uint64, want ...string) {
	t.Helper()
	for name, n := range after {
		d, w := n-before[name], uint64(0)
		if slices.Contains(want, name) {
			w = 1
		}
		if d != w {
			t.Errorf("%s: moved %s %s by %d; the trace said %q", what, kind, name, d, want)
		}
	}
}
