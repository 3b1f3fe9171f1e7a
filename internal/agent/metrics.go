package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/intent"
)

// Collector exposes the datapath counters, the agent's own state and every
// feature that is itself a prometheus.Collector to Prometheus. It reads the per-CPU maps at scrape time: nothing is polled.
type Collector struct {
	node  string
	dp    Datapath
	agent *Agent

	drops, forwards, endpoints, vifs, reconciles, failures *prometheus.Desc
	mapped, asking, capacity, arpEvents                    *prometheus.Desc
	refused                                                *prometheus.Desc
	mapEntries, mapCapacity, mapOverflow                   *prometheus.Desc
	statusWrites, statusWriteFailures                      *prometheus.Desc
	refusedVifs                                            *prometheus.Desc
}

// NewCollector returns a collector for a's node.
func NewCollector(a *Agent) *Collector {
	l := prometheus.Labels{"node": a.cfg.Node}
	return &Collector{
		node: a.cfg.Node, dp: a.dp, agent: a,
		drops: prometheus.NewDesc("onehop_dropped_packets_total",
			"Packets the datapath dropped, by reason (see docs/datapath.md).", []string{"reason"}, l),
		forwards: prometheus.NewDesc("onehop_forwarded_packets_total",
			"Packets the datapath delivered, by path.", []string{"path"}, l),
		endpoints: prometheus.NewDesc("onehop_local_vms",
			"VMs on this host with their vif configured.", nil, l),
		mapped: prometheus.NewDesc("onehop_mapping_table_entries",
			"Remote VMs the mapping table holds a host for (learned by the ARP engine).", nil, l),
		asking: prometheus.NewDesc("onehop_mapping_table_asking",
			"Mapping-table entries for addresses asked for and not answered yet.", nil, l),
		capacity: prometheus.NewDesc("onehop_mapping_table_capacity",
			"The mapping table's fixed size (LRU beyond it).", nil, l),
		arpEvents: prometheus.NewDesc("onehop_arp_engine_events_total",
			"What the ARP engine did, by event (see docs/virtual-router.md).", []string{"event"}, l),
		refused: prometheus.NewDesc("onehop_vm_refused_total",
			"Shared work refused to a VM over its share (what: dhcp, ...), by VM.", []string{"vm", "what"}, l),
		mapEntries: prometheus.NewDesc("onehop_map_entries",
			"Entries this node's intent puts in each reconciled map, by feature and map.", []string{"feature", "map"}, l),
		mapCapacity: prometheus.NewDesc("onehop_map_capacity",
			"Entries each reconciled map takes for one plan (half the map for rule maps: two generations).", []string{"feature", "map"}, l),
		mapOverflow: prometheus.NewDesc("onehop_map_overflow_entries",
			"Entries that did not fit a full map: nothing of that feature was written (0: all fit).", []string{"feature", "map"}, l),
		vifs: prometheus.NewDesc("onehop_attached_vifs",
			"Guest vifs with the datapath attached.", nil, l),
		refusedVifs: prometheus.NewDesc("onehop_refused_vifs",
			"Guests' interfaces left unattached because no guest can be on their kind of link (the agent log says why).", nil, l),
		reconciles: prometheus.NewDesc("onehop_reconciles_total",
			"Reconcile passes of desired state into the datapath.", nil, l),
		failures: prometheus.NewDesc("onehop_reconcile_failures_total",
			"Reconcile passes that failed (the agent log says why).", nil, l),
		statusWrites: prometheus.NewDesc("onehop_agent_status_writes_total",
			"Writes of this host's status record to the store (at most one per --status-interval while changes keep coming).", nil, l),
		statusWriteFailures: prometheus.NewDesc("onehop_agent_status_write_failures_total",
			"Status writes the store refused or did not answer (retried; the agent log says why).", nil, l),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.drops, c.forwards, c.endpoints, c.vifs, c.reconciles, c.failures,
		c.mapped, c.asking, c.capacity, c.arpEvents, c.refused, c.mapEntries, c.mapCapacity, c.mapOverflow,
		c.statusWrites, c.statusWriteFailures, c.refusedVifs} {
		ch <- d
	}
	for _, f := range c.agent.features {
		if m, ok := f.(prometheus.Collector); ok {
			m.Describe(ch)
		}
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	counters, err := c.dp.Counters()
	if err == nil {
		for reason, n := range counters.Drops {
			ch <- prometheus.MustNewConstMetric(c.drops, prometheus.CounterValue, float64(n), reason)
		}
		for path, n := range counters.Forwards {
			ch <- prometheus.MustNewConstMetric(c.forwards, prometheus.CounterValue, float64(n), path)
		}
	} else {
		ch <- prometheus.NewInvalidMetric(c.drops, err)
	}
	st, rec, fail := c.agent.Status()
	ch <- prometheus.MustNewConstMetric(c.endpoints, prometheus.GaugeValue, float64(st.Endpoints))
	ch <- prometheus.MustNewConstMetric(c.vifs, prometheus.GaugeValue, float64(len(st.AttachedVifs)))
	ch <- prometheus.MustNewConstMetric(c.refusedVifs, prometheus.GaugeValue, float64(len(st.RefusedVifs)))
	ch <- prometheus.MustNewConstMetric(c.reconciles, prometheus.CounterValue, float64(rec))
	ch <- prometheus.MustNewConstMetric(c.failures, prometheus.CounterValue, float64(fail))
	writes, wfail := c.agent.StatusWrites()
	ch <- prometheus.MustNewConstMetric(c.statusWrites, prometheus.CounterValue, float64(writes))
	ch <- prometheus.MustNewConstMetric(c.statusWriteFailures, prometheus.CounterValue, float64(wfail))
	for _, u := range c.agent.MapUses() {
		ch <- prometheus.MustNewConstMetric(c.mapEntries, prometheus.GaugeValue, float64(u.Want), u.Feature, u.Map)
		ch <- prometheus.MustNewConstMetric(c.mapCapacity, prometheus.GaugeValue, float64(u.Capacity), u.Feature, u.Map)
		ch <- prometheus.MustNewConstMetric(c.mapOverflow, prometheus.GaugeValue, float64(u.Over), u.Feature, u.Map)
	}
	type share struct{ vm, what string }
	seen := map[share]bool{}
	for _, r := range c.agent.Refusals(counters.Refused) {
		seen[share{r.VM, r.What}] = true
		ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(r.Count), r.VM, r.What)
	}
	// Every local VM's datapath shares, 0 until one is refused: a
	// dashboard never has to tell absent from zero.
	for _, vm := range c.agent.router.names() {
		for _, what := range datapath.ShareKinds() {
			if !seen[share{vm, what}] {
				ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, 0, vm, what)
			}
		}
	}
	// A feature with figures of its own (per sliver, per TAP policy)
	// exports them itself, under the same node label.
	for _, f := range c.agent.features {
		if m, ok := f.(prometheus.Collector); ok {
			m.Collect(ch)
		}
	}
	if c.agent.hooks.ARPStats == nil {
		return
	}
	a := c.agent.hooks.ARPStats()
	ch <- prometheus.MustNewConstMetric(c.mapped, prometheus.GaugeValue, float64(a.Mapped))
	ch <- prometheus.MustNewConstMetric(c.asking, prometheus.GaugeValue, float64(a.Asking))
	ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(a.Capacity))
	for event, n := range ARPEvents(a) {
		ch <- prometheus.MustNewConstMetric(c.arpEvents, prometheus.CounterValue, float64(n), event)
	}
}

// ARPEvents names the ARP engine's counters as metric labels.
func ARPEvents(a intent.ARPStats) map[string]uint64 {
	return map[string]uint64{
		"unicast_request": a.UnicastRequests, "multicast_request": a.MulticastRequests,
		"resolved": a.Resolved, "unresolved": a.Unresolved, "refreshed": a.Refreshed, "expired": a.Expired,
		"lost": a.Lost, "purged": a.Purged, "held": a.Held, "released": a.Released, "discarded": a.Discarded, "announced": a.Announced,
	}
}
