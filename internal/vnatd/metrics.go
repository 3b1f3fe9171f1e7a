package vnatd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/opsport"
	"github.com/onehop/onehop/internal/vcmp"
)

// Refusal reasons the daemon counts (the engine's refused_* counters, and
// the two refusals named otherwise): every one is exported, 0 until it
// happens, so a scrape never has to tell absent from zero.
var refusalReasons = []string{"forged", "replayed", "unkeyed", "nokey", "unknown", "key_source",
	"claim_source", "rekey", "key", "other", "conflict", "directory_full", "unkeyed_source", "unkeyed_rate", "throttled"}

// eventNames are the engine's other counters, exported as events.
var eventNames = []string{"migrated", "updates_applied", "aborted", "closed_forgotten", "update_refused_by_peer",
	"helpers_started", "helpers_stopped", "helper_errors", "ports_remapped", "port_errors",
	"susp_retransmitted", "susp_unanswered", "translate_errors", "unexpected", "vcmp_stream_errors",
	"preempted", "preempted_closed", "preempt_close_errors", "key_file_errors", "sources_throttled",
	"stale_locations", "no_peer_daemon", "away_expired", "updates_from_nat"}

// refusalOf names the refusal reason of an engine counter ("" if it is none).
func refusalOf(counter string) string {
	if r, ok := strings.CutPrefix(counter, "refused_"); ok {
		return r
	}
	if counter == "conflict" || counter == "directory_full" {
		return counter
	}
	return ""
}

// Metrics exposes a daemon to Prometheus: refusals by reason, connections
// by state, restores and their duration, the keepalive helper's answers
// and the datapath's counters. Counters are read at scrape time.
type Metrics struct {
	e        *Engine
	datapath func() (map[string]uint64, error)
	// listeners counts the daemon's listeners (VCMP, control, metrics):
	// onehop_listener_* (nil: none).
	listeners *accept.Stats

	refusals, conns, restores, events, answered, dp, scrapeErrors *prometheus.Desc
	restoreDuration                                               prometheus.Histogram
}

// NewMetrics is the daemon's collector; datapath reads the datapath's
// counters (vnat.Kernel.Counters). Pass its ObserveRestore as the
// engine's Config.OnRestore.
func NewMetrics(datapath func() (map[string]uint64, error)) *Metrics {
	return &Metrics{
		datapath:  datapath,
		listeners: accept.NewStats(nil),
		refusals: prometheus.NewDesc("onehop_vnat_refusals_total",
			"VCMP messages this daemon refused, by reason (docs/vnat-daemon.md).", []string{"reason"}, nil),
		conns: prometheus.NewDesc("onehop_vnat_connections",
			"Connections this daemon knows, by state.", []string{"state"}, nil),
		restores: prometheus.NewDesc("onehop_vnat_restores_total",
			"Restores after this endpoint's address changed.", nil, nil),
		events: prometheus.NewDesc("onehop_vnat_events_total",
			"What the daemon did, by event (docs/vnat-daemon.md).", []string{"event"}, nil),
		answered: prometheus.NewDesc("onehop_vnat_keepalives_answered_total",
			"TCP keepalive probes the keepalive helper answered while a peer was away.", nil, nil),
		dp: prometheus.NewDesc("onehop_vnat_datapath_total",
			"The VNAT datapath's counters (enum vnat_counter, docs/vnat-datapath.md).", []string{"counter"}, nil),
		scrapeErrors: prometheus.NewDesc("onehop_vnat_scrape_errors",
			"1 when this scrape could not read the datapath's counters.", nil, nil),
		restoreDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "onehop_vnat_restore_duration_seconds",
			Help:    "How long a restore took, from the address change to the translations installed.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
	}
}

// Attach makes m report e.
func (m *Metrics) Attach(e *Engine) { m.e = e }

// ObserveRestore records one restore's duration.
func (m *Metrics) ObserveRestore(d time.Duration) { m.restoreDuration.Observe(d.Seconds()) }

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.refusals, m.conns, m.restores, m.events, m.answered, m.dp, m.scrapeErrors} {
		ch <- d
	}
	m.restoreDuration.Describe(ch)
	if m.listeners != nil {
		m.listeners.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	var cs map[string]uint64
	states := map[string]int{}
	if m.e != nil {
		cs = m.e.Counters()
		for _, s := range m.e.Status() {
			states[s.State]++
		}
	}
	ref := map[string]uint64{}
	for _, r := range refusalReasons {
		ref[r] = 0
	}
	for k, v := range cs {
		if r := refusalOf(k); r != "" {
			ref[r] += v
		}
	}
	for r, v := range ref {
		ch <- prometheus.MustNewConstMetric(m.refusals, prometheus.CounterValue, float64(v), r)
	}
	for s := vcmp.Active; s <= vcmp.Aborted; s++ {
		ch <- prometheus.MustNewConstMetric(m.conns, prometheus.GaugeValue, float64(states[s.String()]), s.String())
	}
	ch <- prometheus.MustNewConstMetric(m.restores, prometheus.CounterValue, float64(cs["restores"]))
	for _, ev := range eventNames {
		ch <- prometheus.MustNewConstMetric(m.events, prometheus.CounterValue, float64(cs[ev]), ev)
	}
	m.restoreDuration.Collect(ch)
	failed := 0.0
	if m.datapath != nil {
		dc, err := m.datapath()
		if err != nil {
			failed = 1
		} else {
			ch <- prometheus.MustNewConstMetric(m.answered, prometheus.CounterValue, float64(dc["keepalives_answered"]))
			for k, v := range dc {
				ch <- prometheus.MustNewConstMetric(m.dp, prometheus.CounterValue, float64(v), k)
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(m.scrapeErrors, prometheus.GaugeValue, failed)
	if m.listeners != nil {
		m.listeners.Collect(ch)
	}
}

// ServeMetrics serves m on addr (the operations port: /metrics, /healthz,
// /readyz, /version) until ctx ends.
func ServeMetrics(ctx context.Context, addr string, m *Metrics, log *slog.Logger) (net.Addr, error) {
	l, err := listenMetrics(addr)
	if err != nil {
		return nil, err
	}
	if err := serveMetrics(ctx, l, m, log); err != nil {
		l.Close()
		return nil, err
	}
	return l.Addr(), nil
}

// listenMetrics opens the metrics listener (before anything else is set
// up, so a bad --metrics-addr fails first).
func listenMetrics(addr string) (net.Listener, error) {
	l, err := opsport.Listen("--metrics-addr", addr)
	if err != nil {
		return nil, fmt.Errorf("vnat run: %w", err)
	}
	return l, nil
}

// serveMetrics serves m on l until ctx ends: ready once m reports a
// running engine.
func serveMetrics(ctx context.Context, l net.Listener, m *Metrics, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	if err := reg.Register(m); err != nil {
		return fmt.Errorf("vnat metrics: %w", err)
	}
	opsport.Serve(ctx, l, opsport.Config{Daemon: "vnat", Gatherer: reg, Stats: m.listeners, Log: log, Ready: func() error {
		if m.e == nil {
			return errors.New("no engine running yet")
		}
		return nil
	}})
	return nil
}
