package bpfobj

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/testenv"
)

// specWithEnum is a collection spec whose BTF has one enum, as clang
// writes it for a C enum.
func specWithEnum(t *testing.T, e *btf.Enum) *ebpf.CollectionSpec {
	t.Helper()
	b, err := btf.NewBuilder([]btf.Type{e}, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := b.Marshal(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	types, err := btf.LoadSpecFromReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	return &ebpf.CollectionSpec{Types: types}
}

func TestEnumNamesAreTheCsInLowerCaseByValueWithoutTheCount(t *testing.T) {
	spec := specWithEnum(t, &btf.Enum{Name: "drop_reason", Size: 4, Values: []btf.EnumValue{
		{Name: "DROP_NONE", Value: 0},
		{Name: "DROP_SPOOFED_MAC", Value: 1},
		{Name: "DROP_FIRST_ALIAS", Value: 1}, // an alias: the first name wins
		{Name: "DROP_NO_ROUTE", Value: 3},    // 2 has no name
		{Name: "DROP_REASON_MAX", Value: 4},  // the count, no reason
	}})
	got, err := EnumNames(spec, "drop_reason", "DROP_")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"none", "spoofed_mac", "", "no_route"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("names %q, want %q", got, want)
	}
	if _, err := EnumNames(spec, "forward_path", "FWD_"); err == nil {
		t.Fatal("an enum the BTF does not have was named")
	}
}

func TestPrivilegedCountersAreSummedOverCPUsAndUnnamedSlotsSkipped(t *testing.T) {
	testenv.RequireRoot(t, "creates a BPF map")
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	for slot := uint32(0); slot < 3; slot++ {
		per := make([]uint64, cpus)
		for i := range per {
			per[i] = uint64(slot + 1)
		}
		if err := m.Put(slot, per); err != nil {
			t.Fatal(err)
		}
	}
	got, err := Counters(m, []string{"a", "", "c"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"a": uint64(cpus), "c": 3 * uint64(cpus)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("counters %v, want %v", got, want)
	}
	if _, err := Counters(m, []string{"a", "b", "c", "beyond"}); err == nil {
		t.Fatal("a slot beyond the map was read without an error")
	}
}

// A pinned link outlives the Links that made it; the next Links takes it
// over (same hook) instead of adding a second one, and Detach removes it
// with its pin.
func TestPrivilegedAPinnedLinkIsTakenOverAndDetached(t *testing.T) {
	testenv.RequireRoot(t, "loads a program, mounts a bpffs and makes a namespace")
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs on %s: %v", dir, err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	ns := fmt.Sprintf("oh-bpfobj%d", os.Getpid())
	if err := netns.Create(ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Delete(ns) })
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	pins := filepath.Join(dir, "links") // made by the first pin
	inNS := func(fn func() error) {
		t.Helper()
		if err := netns.Do(ns, fn); err != nil {
			t.Fatal(err)
		}
	}

	first := NewLinks(pins)
	inNS(func() error { return first.TCX("lo/in", "lo", 1, prog, ebpf.AttachTCXIngress) })
	inNS(func() error { return first.TCX("lo/in", "lo", 1, prog, ebpf.AttachTCXIngress) }) // already there
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(pins, "lo_in")); err != nil {
		t.Fatalf("the link's pin: %v", err)
	}

	second := NewLinks(pins)
	inNS(func() error { return second.TCX("lo/in", "lo", 1, prog, ebpf.AttachTCXIngress) })
	if got := second.Held(); !reflect.DeepEqual(got, []string{"lo/in"}) {
		t.Fatalf("held %q after taking the pinned link over", got)
	}
	names, err := second.Names()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(names, []string{"lo/in", "lo_in"}) {
		t.Fatalf("names %q: want the held link and its pin", names)
	}
	attached := func() int {
		t.Helper()
		var n int
		inNS(func() error {
			progs, err := link.QueryPrograms(link.QueryOptions{Target: 1, Attach: ebpf.AttachTCXIngress})
			if err == nil {
				n = len(progs.Programs)
			}
			return err
		})
		return n
	}
	if attached() != 1 {
		t.Fatalf("%d programs on lo's tcx ingress, want the one taken over", attached())
	}
	if err := second.Detach("lo/in"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(pins, "lo_in")); !os.IsNotExist(err) {
		t.Fatalf("the pin after Detach: %v, want it gone", err)
	}
	if n := attached(); n != 0 {
		t.Fatalf("%d programs on lo's tcx ingress after Detach", n)
	}
	if err := second.Detach("lo/in"); err != nil {
		t.Fatalf("detaching what is not there: %v", err)
	}
}
