package gateway

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics exposes a running gateway to Prometheus (its operations port,
// --metrics-addr): what `onehop gateway status` shows, read at scrape
// time. Connection and subflow figures are the open connections'; the
// events are the engine's counters (status's counters: line).
type Metrics struct {
	e                                          *Engine
	conns, subflows, pathUp, pathBytes, events *prometheus.Desc
}

// NewMetrics is e's collector.
func NewMetrics(e *Engine) *Metrics {
	return &Metrics{e: e,
		conns: prometheus.NewDesc("onehop_gateway_connections",
			"Open connections through the gateway, by mode (mptcp, tcp-fallback, native).", []string{"mode"}, nil),
		subflows: prometheus.NewDesc("onehop_gateway_subflows",
			"Live subflows of the open MPTCP connections, by path and TCP state.", []string{"path", "state"}, nil),
		pathUp: prometheus.NewDesc("onehop_gateway_path_up",
			"1 while a wide-area path is up (its link up and, with RLOC probing, a locator over it answering).", []string{"path"}, nil),
		pathBytes: prometheus.NewDesc("onehop_gateway_path_bytes_total",
			"Inner bytes the LISP datapath encapsulated onto a path (tx) and decapsulated from it (rx); with --lisp only.", []string{"path", "direction"}, nil),
		events: prometheus.NewDesc("onehop_gateway_events_total",
			"What the gateway counted, by event: refusals (refused_per_client, listener_*), infrastructure_dropped, subflows joined and failed, RLOC probes (docs/cloud-access-gateway.md).", []string{"event"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.conns, m.subflows, m.pathUp, m.pathBytes, m.events} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	paths, conns := m.e.Status()
	for _, p := range paths {
		up := 0.0
		if p.Up {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(m.pathUp, prometheus.GaugeValue, up, p.Name)
		if p.LISP != nil {
			ch <- prometheus.MustNewConstMetric(m.pathBytes, prometheus.CounterValue, float64(p.LISP.TxBytes), p.Name, "tx")
			ch <- prometheus.MustNewConstMetric(m.pathBytes, prometheus.CounterValue, float64(p.LISP.RxBytes), p.Name, "rx")
		}
	}
	// Every mode is exported, 0 while it has no connection, so a scrape
	// never has to tell absent from zero.
	byMode := map[Mode]int{ModeMPTCP: 0, ModeTCPFallback: 0, ModeNative: 0}
	type sub struct{ path, state string }
	subs := map[sub]int{}
	for _, c := range conns {
		if !c.Open {
			continue
		}
		byMode[c.Mode]++
		for _, s := range c.Subflows {
			subs[sub{s.Path, s.State}]++
		}
	}
	for mode, n := range byMode {
		ch <- prometheus.MustNewConstMetric(m.conns, prometheus.GaugeValue, float64(n), string(mode))
	}
	for s, n := range subs {
		ch <- prometheus.MustNewConstMetric(m.subflows, prometheus.GaugeValue, float64(n), s.path, s.state)
	}
	for k, v := range m.e.Counters() {
		ch <- prometheus.MustNewConstMetric(m.events, prometheus.CounterValue, float64(v), k)
	}
}

// Ready says why the gateway cannot carry a connection over a path (its
// /readyz): nil while at least one path is up.
func (e *Engine) Ready() error {
	paths, _ := e.Status()
	for _, p := range paths {
		if p.Up {
			return nil
		}
	}
	return errors.New("every wide-area path is down")
}
