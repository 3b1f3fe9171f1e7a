package accept

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// What a Listener counts, by kind.
const (
	Accepted     = "accepted"      // connections handed out
	Refused      = "refused"       // connections closed over a cap, by reason
	AcceptErrors = "accept_errors" // temporary accept errors waited out, by errno
	IdleClosed   = "idle_closed"   // connections whose read or write ended for idleness
)

// Refusal reasons.
const (
	ReasonPerSource = "per_source" // the source held Limits.PerSource already
	ReasonTotal     = "total"      // the listener held Limits.Total already
)

// Stats are the counts of one or more listeners, by listener name: a
// prometheus.Collector (onehop_listener_*; docs/security.md). Every
// reason and errno of a declared name is exported, 0 until it happens.
type Stats struct {
	accepted, refused, acceptErrors, idleClosed, openConns *prometheus.Desc

	mu     sync.Mutex
	names  []string
	counts map[statKey]uint64
	opened map[string]int
}

type statKey struct{ name, kind, label string }

// NewStats is an empty set of counts; labels are constant labels every
// metric carries (the agent's node).
func NewStats(labels prometheus.Labels) *Stats {
	return &Stats{
		accepted: prometheus.NewDesc("onehop_listener_accepted_total",
			"Connections a listener accepted and handed to its server.", []string{"listener"}, labels),
		refused: prometheus.NewDesc("onehop_listener_refused_total",
			"Connections a listener closed at once, over its cap per source or in total (reason).", []string{"listener", "reason"}, labels),
		acceptErrors: prometheus.NewDesc("onehop_listener_accept_errors_total",
			"Accept errors a listener waited out (out of descriptors or memory), by errno.", []string{"listener", "errno"}, labels),
		idleClosed: prometheus.NewDesc("onehop_listener_idle_closed_total",
			"Connections ended after nothing moved on them for the listener's idle timeout.", []string{"listener"}, labels),
		openConns: prometheus.NewDesc("onehop_listener_open_connections",
			"Connections a listener accepted that are still open.", []string{"listener"}, labels),
		counts: map[statKey]uint64{}, opened: map[string]int{},
	}
}

func (s *Stats) declare(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Contains(s.names, name) {
		s.names = append(s.names, name)
	}
}

func (s *Stats) add(name, kind, label string, n uint64) {
	s.mu.Lock()
	s.counts[statKey{name, kind, label}] += n
	s.mu.Unlock()
}

func (s *Stats) open(name string, d int) {
	s.mu.Lock()
	s.opened[name] += d
	s.mu.Unlock()
}

// Counters are the counts of the listeners named name: "accepted",
// "refused_per_source", "refused_total", "accept_emfile" (and the other
// errnos), "idle_closed", and the gauge "open".
func (s *Stats) Counters(name string) map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]uint64{
		Accepted: s.counts[statKey{name, Accepted, ""}], IdleClosed: s.counts[statKey{name, IdleClosed, ""}],
		"open": uint64(max(s.opened[name], 0)),
	}
	for _, r := range []string{ReasonPerSource, ReasonTotal} {
		out["refused_"+r] = s.counts[statKey{name, Refused, r}]
	}
	for _, t := range temporary {
		out["accept_"+t.name] = s.counts[statKey{name, AcceptErrors, t.name}]
	}
	return out
}

// Describe implements prometheus.Collector.
func (s *Stats) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{s.accepted, s.refused, s.acceptErrors, s.idleClosed, s.openConns} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *Stats) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	names := slices.Clone(s.names)
	s.mu.Unlock()
	for _, n := range names {
		c := s.Counters(n)
		ch <- prometheus.MustNewConstMetric(s.accepted, prometheus.CounterValue, float64(c[Accepted]), n)
		for _, r := range []string{ReasonPerSource, ReasonTotal} {
			ch <- prometheus.MustNewConstMetric(s.refused, prometheus.CounterValue, float64(c["refused_"+r]), n, r)
		}
		for _, t := range temporary {
			ch <- prometheus.MustNewConstMetric(s.acceptErrors, prometheus.CounterValue, float64(c["accept_"+t.name]), n, t.name)
		}
		ch <- prometheus.MustNewConstMetric(s.idleClosed, prometheus.CounterValue, float64(c[IdleClosed]), n)
		ch <- prometheus.MustNewConstMetric(s.openConns, prometheus.GaugeValue, float64(c["open"]), n)
	}
}
