package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/testenv"
	"github.com/onehop/onehop/internal/version"
)

// A lab with every kind of figure the dashboard shows: VMs on two hosts
// (drops, mapping table, ARP engine, shares), a sliver, a TAP policy.
const opsLab = `name: %s
hosts:
  - name: h1
  - name: h2
farms:
  - name: blue
    subnets:
      - name: web
      - name: ops
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
  - {name: mon1, host: h2, subnet: blue/ops}
slivers:
  - {name: s1, host: h1, ports: "10000-10099"}
taps:
  - {name: web-ping, sender: blue/web/web1, receiver: blue/web/web2, monitor: blue/ops/mon1, proto: icmp}
`

// controllerMetricsPort is the lab controller's operations port (its
// default --metrics-addr, in its own namespace).
const controllerMetricsPort = 9101

// opsGet fetches path from the operations port of node's daemon, with
// curl in node's namespace, and returns the HTTP status and the body.
func (l *testLab) opsGet(node string, port int, path string) (int, string) {
	l.t.Helper()
	out := l.mustIn(node, "curl", "-s", "-w", "\n%{http_code}", fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	i := strings.LastIndexByte(strings.TrimRight(out, "\n"), '\n')
	var code int
	fmt.Sscan(out[i+1:], &code)
	return code, out[:max(i, 0)]
}

// metricNames are the names of the samples a /metrics body holds.
func metricNames(body string) map[string]bool {
	names := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names
}

var metricRe = regexp.MustCompile(`\bonehop_[a-z0-9_]+`)

// dashboardQueries are every PromQL query contrib/grafana/onehop.json
// runs: the panels' targets and the template variables'.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../contrib/grafana/onehop.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("contrib/grafana/onehop.json: %v", err)
	}
	var qs []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			qs = append(qs, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			qs = append(qs, fmt.Sprint(q["query"]))
		}
	}
	return qs
}

// Every query of the Grafana dashboard names metrics that a live lab's
// agents and controller export, and every daemon of the lab answers
// /healthz, /readyz and /version on its operations port, all of one
// version, which `onehop status` confirms.
func TestPrivilegedDashboardQueriesNameMetricsALiveLabExportsAndDaemonsAreHealthy(t *testing.T) {
	l := upLab(t, opsLab)
	l.ping("web1", l.ip("web2"), 2) // drops, forwards, the mapping table and the TAP copies move

	exported := map[string]bool{}
	for _, node := range []string{"h1", "h2"} {
		code, body := l.opsGet(node, lab.MetricsPort, "/metrics")
		if code != 200 {
			t.Fatalf("%s agent /metrics: HTTP %d\n%s", node, code, body)
		}
		for n := range metricNames(body) {
			exported[n] = true
		}
	}
	code, body := l.opsGet("controller", controllerMetricsPort, "/metrics")
	if code != 200 {
		t.Fatalf("controller /metrics: HTTP %d\n%s", code, body)
	}
	for n := range metricNames(body) {
		exported[n] = true
	}
	qs := dashboardQueries(t)
	if len(qs) < 10 {
		t.Fatalf("the dashboard has %d queries, want one per panel at least", len(qs))
	}
	for _, q := range qs {
		names := metricRe.FindAllString(q, -1)
		if len(names) == 0 {
			t.Errorf("dashboard query %q names no onehop metric", q)
		}
		for _, n := range names {
			if !exported[n] {
				t.Errorf("dashboard query %q names %s, which no daemon of the lab exports", q, n)
			}
		}
	}
	for _, family := range []string{"onehop_dropped_packets_total", "onehop_mapping_table_entries", "onehop_arp_engine_events_total",
		"onehop_vm_refused_total", "onehop_tap_copied_packets_total", "onehop_sliver_packets_total", "onehop_etcd_db_size_bytes"} {
		if !slices.ContainsFunc(qs, func(q string) bool { return strings.Contains(q, family) }) {
			t.Errorf("the dashboard shows no %s", family)
		}
	}

	// Health, readiness and version of every daemon of the lab.
	var want version.Info
	out, err := exec.Command(binary, "version", "-o", "json").Output()
	if err != nil || json.Unmarshal(out, &want) != nil {
		t.Fatalf("onehop version -o json: %v\n%s", err, out)
	}
	for _, d := range []struct {
		node string
		port int
	}{{"h1", lab.MetricsPort}, {"h2", lab.MetricsPort}, {"controller", controllerMetricsPort}} {
		if code, body := l.opsGet(d.node, d.port, "/healthz"); code != 200 || strings.TrimSpace(body) != "ok" {
			t.Errorf("%s /healthz: %d %q", d.node, code, body)
		}
		if code, body := l.opsGet(d.node, d.port, "/readyz"); code != 200 || strings.TrimSpace(body) != "ready" {
			t.Errorf("%s /readyz: %d %q, want ready", d.node, code, body)
		}
		var got version.Info
		if code, body := l.opsGet(d.node, d.port, "/version"); code != 200 || json.Unmarshal([]byte(body), &got) != nil || got != want {
			t.Errorf("%s /version: %d %q, want %+v", d.node, code, body, want)
		}
	}
	if code, body := l.opsGet("h1", lab.MetricsPort, "/metrics"); code != 200 || !strings.Contains(body, `onehop_build_info{bpf="`+want.BPF+`"`) {
		t.Errorf("h1 /metrics has no onehop_build_info of this binary (HTTP %d)", code)
	}
	status, err := l.cli("status")
	if err != nil || !strings.Contains(status, "every agent runs the controller's") || !strings.Contains(status, "agents     2 reporting") {
		t.Errorf("onehop status: %v\n%s", err, status)
	}
}

// The access gateway and the xTR serve their operations port like every
// daemon: healthy, ready (a path up; the registration acknowledged), and
// their metrics, which they had none of before.
func TestPrivilegedGatewayAndXTRServeHealthReadinessAndMetrics(t *testing.T) {
	l := upLab(t, cloudTopo)
	for _, d := range []struct {
		node string
		want []string
	}{
		{"gw", []string{`onehop_gateway_path_up{path="wan1"} 1`, `onehop_gateway_path_up{path="wan2"} 1`, `onehop_gateway_connections{mode="mptcp"}`, `onehop_gateway_events_total{event="probe_sent"}`}},
		{"xtr", []string{`onehop_xtr_mappings`, `onehop_xtr_dropped_packets_total{reason=`, `onehop_xtr_registrations_total{event="notified"}`, `onehop_xtr_rloc_probes_total{result="answered"}`}},
	} {
		if code, body := l.opsGet(d.node, lab.MetricsPort, "/healthz"); code != 200 || strings.TrimSpace(body) != "ok" {
			t.Errorf("%s /healthz: %d %q", d.node, code, body)
		}
		testenv.Eventually(t, d.node+" ready", 30*time.Second, func() error {
			if code, body := l.opsGet(d.node, lab.MetricsPort, "/readyz"); code != 200 {
				return fmt.Errorf("HTTP %d %s", code, body)
			}
			return nil
		})
		code, body := l.opsGet(d.node, lab.MetricsPort, "/metrics")
		for _, w := range d.want {
			if code != 200 || !strings.Contains(body, w) {
				t.Errorf("%s /metrics (HTTP %d) lacks %s:\n%s", d.node, code, w, body)
			}
		}
	}
}
