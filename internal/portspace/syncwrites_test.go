package portspace

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/testenv"
)

// writes counts what Sync writes to each map (puts and deletes alike),
// through the feature's table seam over the real maps; failAt[name] = n
// makes the n-th write to that map fail (once), without writing it.
type writes struct {
	n      map[string]int
	failAt map[string]int
}

type countedTable struct {
	m    *ebpf.Map
	name string
	w    *writes
}

func (c countedTable) count() error {
	c.w.n[c.name]++
	if n, ok := c.w.failAt[c.name]; ok && c.w.n[c.name] == n {
		delete(c.w.failAt, c.name)
		c.w.n[c.name]-- // not written
		return fmt.Errorf("write %d to %s refused (test)", n, c.name)
	}
	return nil
}

func (c countedTable) Put(key, value any) error {
	if err := c.count(); err != nil {
		return err
	}
	return c.m.Put(key, value)
}

func (c countedTable) Delete(key any) error {
	if err := c.count(); err != nil {
		return err
	}
	return c.m.Delete(key)
}

// countWrites has f write k's maps through a counter.
func countWrites(f *Feature, k router) *writes {
	w := &writes{n: map[string]int{}, failAt: map[string]int{}}
	f.tables = func(name string) (datapath.Table, error) {
		m, err := k.Map(name)
		if err != nil {
			return nil, err
		}
		return countedTable{m: m, name: name, w: w}, nil
	}
	return w
}

// take returns the writes counted since the last take, by map (maps not
// written left out).
func (w *writes) take() map[string]int {
	out := map[string]int{}
	for k, v := range w.n {
		if v != 0 {
			out[k] = v
		}
	}
	w.n = map[string]int{}
	return out
}

// kernelPorts reads portspace_ports as the kernel holds it, slot by slot (not
// with the feature's own reader).
func kernelPorts(t *testing.T, k router) []uint32 {
	t.Helper()
	m, err := k.Map(MapPorts)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]uint32, portKeys)
	var key, slot uint32
	it := m.Iterate()
	for it.Next(&key, &slot) {
		out[key] = slot
	}
	if err := it.Err(); err != nil {
		t.Fatalf("read portspace_ports: %v", err)
	}
	return out
}

// wantPorts is portspace_ports as p needs it.
func wantPorts(t *testing.T, p Plan) []uint32 {
	t.Helper()
	out := make([]uint32, portKeys)
	if err := portsOf(leasesOf(p), out); err != nil {
		t.Fatal(err)
	}
	return out
}

// samePorts fails t unless the kernel's portspace_ports is exactly p's.
func samePorts(t *testing.T, k router, p Plan, when string) {
	t.Helper()
	got, want := kernelPorts(t, k), wantPorts(t, p)
	diff := 0
	first := -1
	for i := range got {
		if got[i] != want[i] {
			if first < 0 {
				first = i
			}
			diff++
		}
	}
	if diff > 0 {
		t.Errorf("%s: portspace_ports differs from the plan in %d slots (first: uplink %d port %d holds slot %d, want %d)",
			when, diff, first>>16, first&0xffff, got[first], want[first])
	}
}

func compiled(t testing.TB, shrink, dropLast bool) Plan {
	t.Helper()
	p, err := Compile(fullNode(shrink, dropLast))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPrivilegedSyncWritesOnlyWhatChangedAndNothingWhenThePlanIsTheSame(t *testing.T) {
	k, f, _ := loadFeature(t)
	w := countWrites(f, k)
	full := compiled(t, false, false)
	syncPlan(t, f, full)
	first := w.take()
	if first[MapPorts] != 262140 || first[MapSlivers] != 64 || first[MapVifs] != 64 || first[MapUplinks] != 4 {
		t.Errorf("first pass wrote %v, want every leased port (262140), 64 slivers and links, 4 uplinks", first)
	}
	samePorts(t, k, full, "after the first pass")

	for i := 0; i < 5; i++ {
		syncPlan(t, f, full)
		if got := w.take(); len(got) != 0 {
			t.Fatalf("pass %d with the same plan wrote %v, want nothing", i+2, got)
		}
	}

	// One port leaves s1's lease: that port is the host's again, and s1's
	// echo range (its lowest lease) is written again.
	shrunk := compiled(t, true, false)
	syncPlan(t, f, shrunk)
	if got, want := w.take(), map[string]int{MapPorts: 1, MapSlivers: 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("a lease one port shorter wrote %v, want %v", got, want)
	}
	samePorts(t, k, shrunk, "after the lease shrank")
	syncPlan(t, f, shrunk)
	if got := w.take(); len(got) != 0 {
		t.Errorf("the shrunk plan again wrote %v, want nothing", got)
	}

	// The last sliver goes: its 4096 ports, its record, its link, its
	// place in the fan-out, its uplink's count of links (both records of
	// the uplink); the others' shares are sized anew.
	dropped := compiled(t, true, true)
	syncPlan(t, f, dropped)
	if got, want := w.take(), map[string]int{MapPorts: 4096, MapSlivers: 1, MapVifs: 1, MapFanout: 1,
		MapUplinks: 1, "portspace_uplink_index": 1, "portspace_config": 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("a sliver leaving wrote %v, want %v", got, want)
	}
	samePorts(t, k, dropped, "after a sliver left")
}

func TestPrivilegedAFailedPortWriteIsTriedAgainNotBelievedDone(t *testing.T) {
	k, f, _ := loadFeature(t)
	w := countWrites(f, k)
	p := testPlan(0) // 100 + 110 + 1 leased ports
	w.failAt[MapPorts] = 50
	if err := f.Sync(p); err == nil {
		t.Fatal("a pass whose 50th port write failed reported no error")
	}
	if got := w.take()[MapPorts]; got != 49 {
		t.Fatalf("%d ports written before the failure, want 49", got)
	}
	syncPlan(t, f, p)
	if got := w.take()[MapPorts]; got != 211-49 {
		t.Errorf("the next pass wrote %d ports, want the %d not written yet", got, 211-49)
	}
	samePorts(t, k, p, "after the retry")
	syncPlan(t, f, p)
	if got := w.take(); len(got) != 0 {
		t.Errorf("a pass after the retry wrote %v, want nothing", got)
	}

	// A lease change fails halfway, and the plan goes back to what it
	// was before: what the failed pass did write must be undone.
	moved := testPlan(0)
	moved.Slivers[2].Leases = []Lease{{Uplink: 0, Lo: 30001, Hi: 30100}}
	w.failAt[MapPorts] = 40
	if err := f.Sync(moved); err == nil {
		t.Fatal("a pass whose 40th port write failed reported no error")
	}
	w.take()
	syncPlan(t, f, p)
	if got := w.take()[MapPorts]; got != 39 {
		t.Errorf("going back wrote %d ports, want the 39 the failed pass had written", got)
	}
	samePorts(t, k, p, "after going back to the plan of before the failed pass")
}

func TestPrivilegedARestartedAgentConvergesThePinnedMapsOnItsFirstPass(t *testing.T) {
	testenv.RequireRoot(t, "loading and pinning BPF maps")
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount bpffs %s: %v", dir, err)
		}
	})
	pins := filepath.Join(dir, "agentpass")
	open := func() (*datapath.Kernel, *Feature) {
		k, err := datapath.Open(pins, datapath.Options{})
		if err != nil {
			t.Fatalf("open the datapath pinned at %s: %v", pins, err)
		}
		f := New(k)
		f.links = &fakeLinks{slivers: map[string]int{}}
		f.vifMAC = func(int) (net.HardwareAddr, error) { return vifMAC, nil }
		return k, f
	}

	k1, f1 := open()
	syncPlan(t, f1, compiled(t, false, false))
	if err := k1.Close(); err != nil {
		t.Fatal(err)
	}

	// While no agent ran, the last sliver left and s1's lease shrank by
	// a port; and something changed a port of s2's behind its back.
	k2, f2 := open()
	defer k2.Close()
	m, err := k2.Map(MapPorts)
	if err != nil {
		t.Fatal(err)
	}
	s2port := portKey(1, 0) // s2 leases uplink 1's first 4096 ports
	if err := m.Put(s2port, uint32(9)); err != nil {
		t.Fatal(err)
	}
	w := countWrites(f2, k2)
	now := compiled(t, true, true)
	syncPlan(t, f2, now)
	samePorts(t, k2, now, "after the restarted agent's first pass")
	if got := w.take()[MapPorts]; got != 4096+1+1 {
		t.Errorf("the first pass wrote %d ports, want 4098: the last sliver's, s1's lost port and s2's changed one, not the whole map", got)
	}
	syncPlan(t, f2, now)
	if got := w.take(); len(got) != 0 {
		t.Errorf("the second pass wrote %v, want nothing", got)
	}
}

// The feature's reader takes portspace_ports in batches: it must see what a
// slot-by-slot read sees.
func TestPrivilegedPortsAreReadBackAsTheKernelHoldsThem(t *testing.T) {
	k, f, _ := loadFeature(t)
	p := compiled(t, true, true)
	syncPlan(t, f, p)
	got := make([]uint32, portKeys)
	if err := f.readPorts(got); err != nil {
		t.Fatal(err)
	}
	if want := kernelPorts(t, k); !reflect.DeepEqual(got, want) {
		t.Error("the batched read of portspace_ports differs from the slot-by-slot one")
	}
	if err := f.readPorts(make([]uint32, 10)); err == nil || errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("reading portspace_ports into 10 slots: %v, want an error naming the size", err)
	}
}
