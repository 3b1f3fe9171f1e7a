package portspace

import (
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/limits"
	"github.com/onehop/onehop/internal/testenv"
)

// internal/limits says what the compiled programs' maps hold.
func TestLimitsAreTheProgramsMapSizes(t *testing.T) {
	sizes, err := datapath.MapSizes()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{
		"portspace_uplinks": limits.MaxUplinks, "portspace_uplink_index": limits.MaxUplinks, "portspace_addrs": limits.MaxUplinks,
		"portspace_ports": limits.MaxUplinks * 65536, "portspace_slivers": limits.MaxSlivers + 1, "portspace_vifs": limits.MaxSlivers * limits.MaxUplinks,
		"portspace_fanout": limits.MaxSlivers * limits.MaxUplinks, "portspace_cgroups": limits.MaxSlivers, "portspace_shares": limits.MaxSlivers + 1, "portspace_stats": limits.MaxSlivers + 1,
	} {
		if got, ok := sizes[name]; !ok || got != want {
			t.Errorf("map %s holds %d entries (present: %v), want %d", name, got, ok, want)
		}
	}
}

// The agent's feature loads port space's programs on the router's own
// maps: what the sliver program steers by is what Sync writes.
func TestPrivilegedLoadPutsThePortSpaceProgramsOnTheRoutersMaps(t *testing.T) {
	testenv.RequireRoot(t, "loads BPF programs")
	r, err := datapath.Open("", datapath.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	f := New(r)
	if err := f.Load(); err != nil {
		t.Fatal(err)
	}
	k, ok := f.links.(*Kernel)
	if !ok {
		t.Fatalf("the feature attaches with %T, want the loaded *Kernel", f.links)
	}
	ports, err := r.Map(MapPorts)
	if err != nil {
		t.Fatal(err)
	}
	pinfo, err := ports.Info()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := pinfo.ID()
	for _, p := range []*ebpf.Program{k.SliverProgram(), k.LoopbackProgram()} {
		info, err := p.Info()
		if err != nil {
			t.Fatal(err)
		}
		ids, _ := info.MapIDs()
		if !slices.Contains(ids, want) {
			t.Errorf("program %s uses maps %v, not the router's %s (%d)", info.Name, ids, MapPorts, want)
		}
	}
}
