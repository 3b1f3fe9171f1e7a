package portspace

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/internal/intent"
)

// Report implements feature.Reporter: each sliver's counters and the
// connections cut from it go into the agent's status (onehop stats).
func (f *Feature) Report(st *intent.AgentStatus) {
	if f.k == nil {
		return
	}
	stats, err := f.Stats()
	if err != nil {
		if f.rl != nil {
			f.rl.Warn("stats", "reading the slivers' counters", "err", err)
		}
		return
	}
	cut := map[string]uint64{}
	if f.confiner != nil {
		cut = f.confiner.Cut()
	}
	for i := range stats {
		stats[i].Cut = cut[stats[i].Name]
	}
	st.Slivers = stats
}

var (
	sliverPackets = prometheus.NewDesc("onehop_sliver_packets_total",
		"Packets a sliver sent (out) and was delivered (in), by sliver.", []string{"node", "sliver", "dir"}, nil)
	sliverBytes = prometheus.NewDesc("onehop_sliver_bytes_total",
		"Bytes a sliver sent (out) and was delivered (in), by sliver.", []string{"node", "sliver", "dir"}, nil)
	sliverDrops = prometheus.NewDesc("onehop_sliver_dropped_packets_total",
		"A sliver's packets the datapath dropped, by sliver and reason (see docs/port-space.md).", []string{"node", "sliver", "reason"}, nil)
	sliverCut = prometheus.NewDesc("onehop_sliver_connections_cut_total",
		"A sliver's connections cut because a lease change took their ports away.", []string{"node", "sliver"}, nil)
)

// Describe implements prometheus.Collector: the agent exports a feature
// that is one.
func (f *Feature) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{sliverPackets, sliverBytes, sliverDrops, sliverCut} {
		ch <- d
	}
}

// dropReasons names every slot of a sliver's drop counters.
func (f *Feature) dropReasons() []string {
	var out []string
	for i := range len(countersRecord{}.Drops) {
		if name := dropName(f.k, i); name != "" {
			out = append(out, name)
		}
	}
	return out
}

// Collect implements prometheus.Collector, reading the counters at scrape
// time.
func (f *Feature) Collect(ch chan<- prometheus.Metric) {
	if f.k == nil {
		return
	}
	stats, err := f.Stats()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(sliverPackets, err)
		return
	}
	cut := map[string]uint64{}
	if f.confiner != nil {
		cut = f.confiner.Cut()
	}
	for _, s := range stats {
		ch <- prometheus.MustNewConstMetric(sliverPackets, prometheus.CounterValue, float64(s.PacketsIn), f.node, s.Name, "in")
		ch <- prometheus.MustNewConstMetric(sliverPackets, prometheus.CounterValue, float64(s.PacketsOut), f.node, s.Name, "out")
		ch <- prometheus.MustNewConstMetric(sliverBytes, prometheus.CounterValue, float64(s.BytesIn), f.node, s.Name, "in")
		ch <- prometheus.MustNewConstMetric(sliverBytes, prometheus.CounterValue, float64(s.BytesOut), f.node, s.Name, "out")
		// Every reason, 0 until it happens: a dashboard never has to
		// tell absent from zero (Stats keeps only those that did).
		named := f.dropReasons()
		for _, reason := range named {
			ch <- prometheus.MustNewConstMetric(sliverDrops, prometheus.CounterValue, float64(s.Drops[reason]), f.node, s.Name, reason)
		}
		for reason, n := range s.Drops {
			if !slices.Contains(named, reason) { // a slot the C names and Go does not know yet
				ch <- prometheus.MustNewConstMetric(sliverDrops, prometheus.CounterValue, float64(n), f.node, s.Name, reason)
			}
		}
		ch <- prometheus.MustNewConstMetric(sliverCut, prometheus.CounterValue, float64(cut[s.Name]), f.node, s.Name)
	}
}
