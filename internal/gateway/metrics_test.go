package gateway

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/opsport/opsporttest"
)

// The gateway's metrics are status's figures: every mode's open
// connections (0 included), each path's state, the engine's counters; and
// it is ready while a path is up.
func TestGatewayMetricsAndReadinessFollowItsPaths(t *testing.T) {
	cfg := validConfig()
	cfg.MaxPerClient = 1
	e := NewEngine(&cfg, EngineDeps{})
	a := netip.MustParseAddr("10.66.0.2")
	e.admit(a)
	e.admit(a) // over its share: refused and counted
	m := opsporttest.Gather(t, NewMetrics(e))
	for key, want := range map[string]float64{
		`onehop_gateway_path_up{path="wan1"}`:                     1,
		`onehop_gateway_path_up{path="wan2"}`:                     1,
		`onehop_gateway_connections{mode="mptcp"}`:                0,
		`onehop_gateway_connections{mode="tcp-fallback"}`:         0,
		`onehop_gateway_connections{mode="native"}`:               0,
		`onehop_gateway_events_total{event="refused_per_client"}`: 1,
	} {
		if got, ok := m[key]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
		}
	}
	if err := e.Ready(); err != nil {
		t.Fatalf("both paths up: not ready: %v", err)
	}
	e.SetPathUp(0, false)
	if err := e.Ready(); err != nil {
		t.Fatalf("one path up: not ready: %v", err)
	}
	e.SetPathUp(1, false)
	if err := e.Ready(); err == nil || !strings.Contains(err.Error(), "every wide-area path is down") {
		t.Fatalf("no path up: Ready %v, want every wide-area path is down", err)
	}
	if m := opsporttest.Gather(t, NewMetrics(e)); m[`onehop_gateway_path_up{path="wan1"}`] != 0 {
		t.Errorf("a path down reads %v, want 0", m[`onehop_gateway_path_up{path="wan1"}`])
	}
}
