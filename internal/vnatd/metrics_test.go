package vnatd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/vcmp"
)

// scrape fetches url and parses it strictly as the Prometheus text format.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	return scrapeWith(t, http.DefaultClient, url)
}

// scrapeIn scrapes addr's /metrics from inside network namespace ns (the
// connection is made there; http's own dials run on other threads).
func scrapeIn(t *testing.T, ns, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	var c net.Conn
	if err := netns.Do(ns, func() (err error) {
		c, err = net.Dial("tcp4", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	used := false
	cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(context.Context, string, string) (net.Conn, error) {
		if used {
			return nil, fmt.Errorf("one connection only")
		}
		used = true
		return c, nil
	}}}
	return scrapeWith(t, cl, "http://"+addr+"/metrics")
}

func scrapeWith(t *testing.T, cl *http.Client, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := cl.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s: %s", url, resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: not the Prometheus text format: %v", url, err)
	}
	return fams
}

// value is the sample of family name with the label set (nil: none);
// absent is a failure, never zero.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, typ dto.MetricType, labels map[string]string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	if f.GetType() != typ {
		t.Fatalf("%s is a %s, want %s", name, f.GetType(), typ)
	}
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if fmt.Sprint(got) != fmt.Sprint(labels) && !(len(got) == 0 && labels == nil) {
			continue
		}
		switch typ {
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue()
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue()
		case dto.MetricType_HISTOGRAM:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("no %s sample with labels %v", name, labels)
	return 0
}

// The daemon's metrics, served by ServeMetrics and parsed strictly:
// refusals by reason (5 forged here, the other reasons present at 0),
// connections by state, restores and the restore-duration histogram, the
// keepalive helper's answers and the datapath's counters.
func TestMetricsAreServedAndParse(t *testing.T) {
	n := newNetwork()
	dpCounters := map[string]uint64{"keepalives_answered": 7, "egress_translated": 3}
	ma := NewMetrics(func() (map[string]uint64, error) { return dpCounters, nil })
	mb := NewMetrics(func() (map[string]uint64, error) { return dpCounters, nil })
	a := n.add(t, "a", "10.0.1.1", Config{OnRestore: ma.ObserveRestore})
	b := n.add(t, "b", "10.0.2.2", Config{})
	ma.Attach(a.e)
	mb.Attach(b.e)
	mallory := n.add(t, "mallory", "10.0.6.6", Config{})
	ta, tb := connect(a, b, 40000)
	connect(a, b, 40001)
	keyAll(t, a, b)
	if _, err := a.e.Suspend(t.Context(), func(v vcmp.Tuple) bool { return v == ta }); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		forged, err := vcmp.Seal(&vcmp.Update{Record: vcmp.Record{Conn: ta, Phys: netip.AddrPortFrom(mallory.addr, 1)}}, vcmp.Secret{7}, uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		wantRefused(t, "forged", sendOne(t, n, mallory, b.addr, forged))
	}
	_ = tb
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	atB, err := ServeMetrics(ctx, "127.0.0.1:0", mb, log)
	if err != nil {
		t.Fatal(err)
	}
	atA, err := ServeMetrics(ctx, "127.0.0.1:0", ma, log)
	if err != nil {
		t.Fatal(err)
	}

	fb := scrape(t, "http://"+atB.String()+"/metrics")
	if v := value(t, fb, "onehop_vnat_refusals_total", dto.MetricType_COUNTER, map[string]string{"reason": "forged"}); v != 5 {
		t.Errorf("b refusals{forged} = %v, want 5", v)
	}
	for _, r := range refusalReasons {
		if r != "forged" {
			if v := value(t, fb, "onehop_vnat_refusals_total", dto.MetricType_COUNTER, map[string]string{"reason": r}); v != 0 {
				t.Errorf("b refusals{%s} = %v, want 0", r, v)
			}
		}
	}
	if v := value(t, fb, "onehop_vnat_connections", dto.MetricType_GAUGE, map[string]string{"state": "suspended"}); v != 1 {
		t.Errorf("b connections{suspended} = %v, want 1", v)
	}
	if v := value(t, fb, "onehop_vnat_connections", dto.MetricType_GAUGE, map[string]string{"state": "active"}); v != 1 {
		t.Errorf("b connections{active} = %v, want 1", v)
	}
	if v := value(t, fb, "onehop_vnat_events_total", dto.MetricType_COUNTER, map[string]string{"event": "helpers_started"}); v != 1 {
		t.Errorf("b events{helpers_started} = %v, want 1", v)
	}
	if v := value(t, fb, "onehop_vnat_keepalives_answered_total", dto.MetricType_COUNTER, nil); v != 7 {
		t.Errorf("b keepalives answered = %v, want 7", v)
	}
	if v := value(t, fb, "onehop_vnat_datapath_total", dto.MetricType_COUNTER, map[string]string{"counter": "egress_translated"}); v != 3 {
		t.Errorf("b datapath{egress_translated} = %v, want 3", v)
	}
	if v := value(t, fb, "onehop_vnat_scrape_errors", dto.MetricType_GAUGE, nil); v != 0 {
		t.Errorf("b scrape errors = %v, want 0", v)
	}
	if v := value(t, fb, "onehop_vnat_restore_duration_seconds", dto.MetricType_HISTOGRAM, nil); v != 0 {
		t.Errorf("b restore durations observed: %v, want 0", v)
	}
	// The metrics port's own listener: this scrape accepted, no refusals.
	if v := value(t, fb, "onehop_listener_accepted_total", dto.MetricType_COUNTER, map[string]string{"listener": "metrics"}); v != 1 {
		t.Errorf("b listener{metrics} accepted = %v, want 1", v)
	}
	for _, r := range []string{"per_source", "total"} {
		if v := value(t, fb, "onehop_listener_refused_total", dto.MetricType_COUNTER, map[string]string{"listener": "metrics", "reason": r}); v != 0 {
			t.Errorf("b listener{metrics} refused{%s} = %v, want 0", r, v)
		}
	}

	old, new := n.move(a, "10.0.3.3")
	if err := a.e.Restore(t.Context(), old, new); err != nil {
		t.Fatal(err)
	}
	fa := scrape(t, "http://"+atA.String()+"/metrics")
	if v := value(t, fa, "onehop_vnat_restores_total", dto.MetricType_COUNTER, nil); v != 1 {
		t.Errorf("a restores = %v, want 1", v)
	}
	if v := value(t, fa, "onehop_vnat_restore_duration_seconds", dto.MetricType_HISTOGRAM, nil); v != 1 {
		t.Errorf("a restore durations observed: %v, want 1", v)
	}
	if v := value(t, fa, "onehop_vnat_connections", dto.MetricType_GAUGE, map[string]string{"state": "migrated"}); v != 2 {
		t.Errorf("a connections{migrated} = %v, want 2", v)
	}
	for _, s := range []string{"locating", "aborted"} {
		if v := value(t, fa, "onehop_vnat_connections", dto.MetricType_GAUGE, map[string]string{"state": s}); v != 0 {
			t.Errorf("a connections{%s} = %v, want 0", s, v)
		}
	}

	// A datapath that cannot be read says so, and its metrics go.
	ma.datapath = func() (map[string]uint64, error) { return nil, fmt.Errorf("map gone") }
	fa = scrape(t, "http://"+atA.String()+"/metrics")
	if v := value(t, fa, "onehop_vnat_scrape_errors", dto.MetricType_GAUGE, nil); v != 1 {
		t.Errorf("scrape errors with a broken datapath = %v, want 1", v)
	}
	if _, ok := fa["onehop_vnat_keepalives_answered_total"]; ok {
		t.Error("keepalives answered exported from a datapath that could not be read")
	}
	if _, err := ServeMetrics(ctx, "not an address", ma, log); err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Errorf("a bad --metrics-addr address: %v, want an error naming --metrics-addr", err)
	}
}
