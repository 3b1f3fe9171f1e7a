package datapath

import (
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/testenv"
)

// A restart with another --mapping-table-size replaces that one map and
// carries its learned entries over; every other pinned map (endpoints,
// rules, conntrack) is reused as it is, not flushed.
func TestPrivilegedResizedPinnedMapKeepsItsEntriesAndOthersAreReused(t *testing.T) {
	testenv.RequireRoot(t, "loading and pinning BPF maps")
	dir := mountBPFFS(t)

	k1, err := Open(dir, Options{Sizes: Sizes{Mappings: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	const learned = 600
	for i := 0; i < learned; i++ {
		if err := k1.vif.Mappings.Put(IPKey(vmAddr(i)), Mapping{HostMac: [6]byte{2, 0, 0, 0, 0, byte(i)}, ConfirmedNs: 1, UsedNs: 1}); err != nil {
			t.Fatal(err)
		}
	}
	ep := IPKey(vmAddr(5000))
	if err := k1.maps["endpoints"].Put(ep, Endpoint{Ifindex: 7}); err != nil {
		t.Fatal(err)
	}
	id := func(m *ebpf.Map) ebpf.MapID {
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		mid, _ := info.ID()
		return mid
	}
	endpointsID := id(k1.maps["endpoints"])
	k1.Close()

	k2, err := Open(dir, Options{Sizes: Sizes{Mappings: 4096}})
	if err != nil {
		t.Fatalf("reopen with a larger mapping table: %v", err)
	}
	defer k2.Close()
	if got := k2.MappingCapacity(); got != 4096 {
		t.Errorf("mapping table holds %d after the restart, want the new size 4096", got)
	}
	n := 0
	var key uint32
	var val Mapping
	for it := k2.vif.Mappings.Iterate(); it.Next(&key, &val); {
		n++
	}
	if n != learned {
		t.Errorf("resized mapping table holds %d entries, want the %d learned before the restart", n, learned)
	}
	var got Endpoint
	if err := k2.maps["endpoints"].Lookup(ep, &got); err != nil || got.Ifindex != 7 {
		t.Errorf("endpoint written before the restart: %+v, %v; want it kept", got, err)
	}
	if now := id(k2.maps["endpoints"]); now != endpointsID {
		t.Errorf("endpoints map is a new one (id %d, was %d): pins other than the resized map were not reused", now, endpointsID)
	}
	if entries, _ := os.ReadDir(dir + "/maps"); len(entries) > 0 {
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), asideSuffix) {
				t.Errorf("set-aside pin %s left behind", e.Name())
			}
		}
	}
}

// mountBPFFS mounts a bpffs of the test's own on a temporary directory.
func mountBPFFS(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount bpffs %s: %v", dir, err)
		}
	})
	return dir
}
