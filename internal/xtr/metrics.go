package xtr

import (
	"errors"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/internal/lisp"
)

// Sources are what the xTR's metrics read at scrape time; Run fills them
// from the running xTR, tests from fakes.
type Sources struct {
	// Datapath reads the LISP datapath's counters (lispdp.Kernel.Counters).
	Datapath func() (map[string]uint64, error)
	// Probes reads the RLOC-probe responder's counters.
	Probes func() ProbeStats
	// Registrar reads the registration's counters.
	Registrar func() lisp.RegistrarStats
	// Mappings is how many remote EIDs have a mapping installed.
	Mappings func() int
	// Resolves counts the map-requests by outcome (installed, negative,
	// failed) and Replayed the first SYNs handed to the site again.
	Resolves func() map[string]uint64
	Replayed func() uint64
}

// Metrics exposes a running xTR to Prometheus (its operations port,
// --metrics-addr).
type Metrics struct {
	src                                                   Sources
	drops, packets, mappings, resolves, probes, registers *prometheus.Desc
	replayed, scrapeErrors                                *prometheus.Desc
}

// NewMetrics is the collector of the xTR src reads.
func NewMetrics(src Sources) *Metrics {
	return &Metrics{src: src,
		drops: prometheus.NewDesc("onehop_xtr_dropped_packets_total",
			"Packets the LISP datapath dropped, by reason (docs/lisp-datapath.md).", []string{"reason"}, nil),
		packets: prometheus.NewDesc("onehop_xtr_packets_total",
			"Packets the LISP datapath handled, by what it did (encapsulated, decapsulated, native...).", []string{"counter"}, nil),
		mappings: prometheus.NewDesc("onehop_xtr_mappings",
			"Remote EIDs (an access gateway's per-path EIDs) with a mapping installed in the datapath.", nil, nil),
		resolves: prometheus.NewDesc("onehop_xtr_map_requests_total",
			"Map-requests for remote EIDs, by outcome: installed, negative (no mapping), failed (asked again later).", []string{"result"}, nil),
		probes: prometheus.NewDesc("onehop_xtr_rloc_probes_total",
			"RLOC probes to this xTR's locators, by what became of them: answered, rate_limited, refused.", []string{"result"}, nil),
		registers: prometheus.NewDesc("onehop_xtr_registrations_total",
			"The site's registration with the map-server: Map-Registers sent, Map-Notifies accepted and refused, timeouts, failed registrations.", []string{"event"}, nil),
		replayed: prometheus.NewDesc("onehop_xtr_syns_replayed_total",
			"First SYNs of remote EIDs handed to the site again once their mapping was installed.", nil, nil),
		scrapeErrors: prometheus.NewDesc("onehop_xtr_scrape_errors",
			"1 when this scrape could not read the datapath's counters.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.drops, m.packets, m.mappings, m.resolves, m.probes, m.registers, m.replayed, m.scrapeErrors} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	failed := 0.0
	if dp, err := m.src.Datapath(); err != nil {
		failed = 1
	} else {
		for k, v := range dp {
			if r, ok := strings.CutPrefix(k, "drop_"); ok {
				ch <- prometheus.MustNewConstMetric(m.drops, prometheus.CounterValue, float64(v), r)
			} else {
				ch <- prometheus.MustNewConstMetric(m.packets, prometheus.CounterValue, float64(v), k)
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(m.scrapeErrors, prometheus.GaugeValue, failed)
	ch <- prometheus.MustNewConstMetric(m.mappings, prometheus.GaugeValue, float64(m.src.Mappings()))
	for r, v := range m.src.Resolves() {
		ch <- prometheus.MustNewConstMetric(m.resolves, prometheus.CounterValue, float64(v), r)
	}
	p := m.src.Probes()
	for r, v := range map[string]uint64{"answered": p.Answered, "rate_limited": p.RateLimited, "refused": p.Refused} {
		ch <- prometheus.MustNewConstMetric(m.probes, prometheus.CounterValue, float64(v), r)
	}
	g := m.src.Registrar()
	for ev, v := range map[string]uint64{"sent": g.Sent, "notified": g.Notified, "timeouts": g.Timeouts, "refused_notify": g.RefusedNotify, "failed": g.FailedRegister} {
		ch <- prometheus.MustNewConstMetric(m.registers, prometheus.CounterValue, float64(v), ev)
	}
	ch <- prometheus.MustNewConstMetric(m.replayed, prometheus.CounterValue, float64(m.src.Replayed()))
}

// Ready says why the xTR does not carry the site yet (its /readyz): nil
// once the map-server has acknowledged its registration (a Map-Notify),
// the datapath being attached before the registration starts.
func (s Sources) Ready() error {
	if s.Registrar().Notified == 0 {
		return errors.New("the map-server has not acknowledged the registration yet (no Map-Notify)")
	}
	return nil
}
