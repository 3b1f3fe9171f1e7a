package tap

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/internal/intent"
)

// Report implements feature.Reporter: each rule's copies go into the
// agent's status (onehop stats).
func (f *Feature) Report(st *intent.AgentStatus) {
	if f.k == nil {
		return
	}
	stats, err := f.Stats()
	if err != nil {
		if f.rl != nil {
			f.rl.Warn("stats", "reading the tap rules' counters", "err", err)
		}
		return
	}
	st.Taps = stats
}

var (
	tapPackets = prometheus.NewDesc("onehop_tap_copied_packets_total",
		"Copies of tapped packets: made at the sender's edge, or delivered to a local monitor from the fabric, by policy and rule id (the reverse of a two-way policy has bit 31 set).",
		[]string{"node", "policy", "id"}, nil)
	tapBytes = prometheus.NewDesc("onehop_tap_copied_bytes_total",
		"Bytes of the copies counted by onehop_tap_copied_packets_total.", []string{"node", "policy", "id"}, nil)
	tapDropped = prometheus.NewDesc("onehop_tap_copies_dropped_total",
		"Copies lost: over the monitor's copy rate, or the monitor's queue full; never a production packet.",
		[]string{"node", "policy", "id"}, nil)
)

// Describe implements prometheus.Collector: the agent exports a feature
// that is one.
func (f *Feature) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{tapPackets, tapBytes, tapDropped} {
		ch <- d
	}
}

// Collect implements prometheus.Collector, reading the counters at scrape
// time: every synced rule has its three series, zero included.
func (f *Feature) Collect(ch chan<- prometheus.Metric) {
	if f.k == nil {
		return
	}
	stats, err := f.Stats()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(tapPackets, err)
		return
	}
	for _, s := range stats {
		id := strconv.FormatUint(uint64(s.ID), 10)
		ch <- prometheus.MustNewConstMetric(tapPackets, prometheus.CounterValue, float64(s.Packets), f.node, s.Policy, id)
		ch <- prometheus.MustNewConstMetric(tapBytes, prometheus.CounterValue, float64(s.Bytes), f.node, s.Policy, id)
		ch <- prometheus.MustNewConstMetric(tapDropped, prometheus.CounterValue, float64(s.Dropped), f.node, s.Policy, id)
	}
}
