package egress

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/internal/intent"
)

// Report implements feature.Reporter: each egress VM's slice use and
// counters go into the agent's status (onehop stats). Reading them also
// logs, rate-limited, a VM whose refusals grew.
func (f *Feature) Report(st *intent.AgentStatus) {
	stats, err := f.Stats()
	if err != nil {
		if f.rl != nil {
			f.rl.Warn("stats", "reading the egress counters", "err", err)
		}
		return
	}
	st.Egress = stats
}

var (
	egressPackets = prometheus.NewDesc("onehop_egress_packets_total",
		"Packets a VM sent through its egress slice or published ports (out) and received back or by a publication (in), by VM.", []string{"node", "vm", "dir"}, nil)
	egressBytes = prometheus.NewDesc("onehop_egress_bytes_total",
		"Bytes a VM sent through its egress slice or published ports (out) and received back or by a publication (in), by VM.", []string{"node", "vm", "dir"}, nil)
	egressFlows = prometheus.NewDesc("onehop_egress_flows_total",
		"Translations a VM opened (a port of its slice claimed).", []string{"node", "vm"}, nil)
	egressRefused = prometheus.NewDesc("onehop_egress_refused_total",
		"A VM's new flows out refused because its own slice was full.", []string{"node", "vm"}, nil)
	egressNotAllowed = prometheus.NewDesc("onehop_egress_not_allowed_total",
		"A VM's packets to destinations its farm's egress list does not hold.", []string{"node", "vm"}, nil)
	egressLive = prometheus.NewDesc("onehop_egress_slice_used_ports",
		"Ports of a VM's slice holding a live translation.", []string{"node", "vm"}, nil)
	egressSize = prometheus.NewDesc("onehop_egress_slice_ports",
		"The size of a VM's slice of its host's address.", []string{"node", "vm"}, nil)
)

// Describe implements prometheus.Collector.
func (f *Feature) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{egressPackets, egressBytes, egressFlows, egressRefused, egressNotAllowed, egressLive, egressSize} {
		ch <- d
	}
}

// Collect implements prometheus.Collector, reading the counters at scrape
// time.
func (f *Feature) Collect(ch chan<- prometheus.Metric) {
	stats, err := f.Stats()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(egressPackets, err)
		return
	}
	for _, s := range stats {
		c := func(d *prometheus.Desc, v float64, l ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, append([]string{f.node, s.Name}, l...)...)
		}
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, f.node, s.Name)
		}
		c(egressPackets, float64(s.PacketsOut), "out")
		c(egressPackets, float64(s.PacketsIn), "in")
		c(egressBytes, float64(s.BytesOut), "out")
		c(egressBytes, float64(s.BytesIn), "in")
		c(egressFlows, float64(s.Flows))
		c(egressRefused, float64(s.Refused))
		c(egressNotAllowed, float64(s.NotAllowed))
		g(egressLive, float64(s.Live))
		g(egressSize, float64(s.Ports))
	}
}
