package xtr

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/lisp"
	"github.com/onehop/onehop/internal/opsport/opsporttest"
)

func fakeSources(dp map[string]uint64, dpErr error, notified uint64) Sources {
	return Sources{
		Datapath:  func() (map[string]uint64, error) { return dp, dpErr },
		Probes:    func() ProbeStats { return ProbeStats{Answered: 4, RateLimited: 2} },
		Registrar: func() lisp.RegistrarStats { return lisp.RegistrarStats{Sent: 3, Notified: notified} },
		Mappings:  func() int { return 2 },
		Resolves:  func() map[string]uint64 { return map[string]uint64{"installed": 2, "negative": 1, "failed": 0} },
		Replayed:  func() uint64 { return 1 },
	}
}

// The xTR's metrics split the datapath's counters into drops by reason and
// the rest, and carry the mappings, map-requests, probes and registrations.
func TestXTRMetricsNameDropsMappingsProbesAndRegistrations(t *testing.T) {
	m := opsporttest.Gather(t, NewMetrics(fakeSources(map[string]uint64{"encapsulated": 10, "drop_unknown_rloc": 3}, nil, 1)))
	for key, want := range map[string]float64{
		`onehop_xtr_packets_total{counter="encapsulated"}`:        10,
		`onehop_xtr_dropped_packets_total{reason="unknown_rloc"}`: 3,
		`onehop_xtr_mappings`:                                 2,
		`onehop_xtr_map_requests_total{result="negative"}`:    1,
		`onehop_xtr_rloc_probes_total{result="rate_limited"}`: 2,
		`onehop_xtr_registrations_total{event="notified"}`:    1,
		`onehop_xtr_registrations_total{event="sent"}`:        3,
		`onehop_xtr_syns_replayed_total`:                      1,
		`onehop_xtr_scrape_errors`:                            0,
	} {
		if got, ok := m[key]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
		}
	}
	m = opsporttest.Gather(t, NewMetrics(fakeSources(nil, errors.New("map gone"), 1)))
	if m[`onehop_xtr_scrape_errors`] != 1 {
		t.Errorf("a datapath that cannot be read: scrape errors %v, want 1", m[`onehop_xtr_scrape_errors`])
	}
}

func TestXTRIsReadyOnceTheMapServerAcknowledgedItsRegistration(t *testing.T) {
	if err := fakeSources(nil, nil, 0).Ready(); err == nil || !strings.Contains(err.Error(), "no Map-Notify") {
		t.Fatalf("no Map-Notify yet: Ready %v, want not ready", err)
	}
	if err := fakeSources(nil, nil, 1).Ready(); err != nil {
		t.Fatalf("acknowledged: Ready %v", err)
	}
}

func TestCacheCountsOnlyInstalledMappings(t *testing.T) {
	var c Cache
	now := time.Now()
	a, b := netip.MustParseAddr("10.77.0.1"), netip.MustParseAddr("10.99.0.1")
	c.Seen(a, now)
	c.Seen(b, now)
	c.Resolved(a, lisp.Record{EID: netip.MustParsePrefix("10.77.0.0/24"), TTL: time.Minute, Locators: []lisp.Locator{{}}}, []Choice{{}}, now)
	if n := c.Installed(); n != 1 {
		t.Fatalf("one of two resolved: Installed %d, want 1", n)
	}
}
