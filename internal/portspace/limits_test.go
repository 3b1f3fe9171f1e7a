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
		"ps_uplinks": limits.MaxUplinks, "ps_uplink_index": limits.MaxUplinks, "ps_addrs": limits.MaxUplinks,
		"ps_ports": limits.MaxUplinks * 65536, "ps_slivers": limits.MaxSlivers + 1, "ps_vifs": limits.MaxSlivers * limits.MaxUplinks,
		"ps_fanout": limits.MaxSlivers * limits.MaxUplinks, "ps_cgroups": limits.MaxSlivers, "ps_shares": limits.MaxSlivers + 1, "ps_stats": limits.MaxSlivers + 1,
	} {
		if got, ok := sizes[name]; !ok || got != want {
			t.Errorf("map %s holds %d entries (present: %v), want %d", name, got, ok, want)
		}
	}
}
