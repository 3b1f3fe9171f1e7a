package portspace

import (
	"testing"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/limits"
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
