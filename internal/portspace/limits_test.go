package portspace

import (
	"testing"

	"github.com/onehop/onehop/internal/datapath"
)

// plan.go's limits are the compiled programs' map sizes.
func TestLimitsAreTheProgramsMapSizes(t *testing.T) {
	if datapath.PsMaxUplinks != MaxUplinks || datapath.PsMaxSlivers != MaxSlivers {
		t.Fatalf("datapath sizes %d uplinks, %d slivers; plan.go says %d, %d", datapath.PsMaxUplinks, datapath.PsMaxSlivers, MaxUplinks, MaxSlivers)
	}
	sizes, err := datapath.MapSizes()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{
		"ps_uplinks": MaxUplinks, "ps_uplink_index": MaxUplinks, "ps_addrs": MaxUplinks,
		"ps_ports": MaxUplinks * 65536, "ps_slivers": MaxSlivers + 1, "ps_vifs": MaxSlivers * MaxUplinks,
		"ps_fanout": MaxSlivers * MaxUplinks, "ps_cgroups": MaxSlivers, "ps_shares": MaxSlivers + 1, "ps_stats": MaxSlivers + 1,
	} {
		if got, ok := sizes[name]; !ok || got != want {
			t.Errorf("map %s holds %d entries (present: %v), want %d", name, got, ok, want)
		}
	}
}
