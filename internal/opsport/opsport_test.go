package opsport

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/testenv"
	"github.com/onehop/onehop/internal/version"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

func TestThePortServesMetricsHealthReadinessAndVersion(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "onehop_test_things_total", Help: "things"})
	c.Add(3)
	reg.MustRegister(c)
	var notReady atomic.Pointer[error]
	why := errors.New("reconciled to revision 4, has seen 7")
	notReady.Store(&why)
	stats := accept.NewStats(nil)
	l, err := Listen("--metrics-addr", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	Serve(ctx, l, Config{Daemon: "agent", Gatherer: reg, Stats: stats, Ready: func() error {
		if e := notReady.Load(); e != nil {
			return *e
		}
		return nil
	}})
	base := "http://" + l.Addr().String()

	if code, body := get(t, base+"/healthz"); code != 200 || strings.TrimSpace(body) != "ok" {
		t.Errorf("/healthz: %d %q, want 200 ok", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "has seen 7") {
		t.Errorf("/readyz while not ready: %d %q, want 503 naming why", code, body)
	}
	notReady.Store(nil)
	if code, body := get(t, base+"/readyz"); code != 200 || strings.TrimSpace(body) != "ready" {
		t.Errorf("/readyz once ready: %d %q, want 200 ready", code, body)
	}
	code, body := get(t, base+"/metrics")
	v := version.Get()
	for _, want := range []string{"onehop_test_things_total 3", `onehop_build_info{bpf="` + v.BPF + `",commit="` + v.Commit + `",daemon="agent"`} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics: %d, no %q in\n%s", code, want, body)
		}
	}
	var got version.Info
	code, body = get(t, base+"/version")
	if err := json.Unmarshal([]byte(body), &got); code != 200 || err != nil || got != v {
		t.Errorf("/version: %d %q (%v), want %+v", code, body, err, v)
	}
	if n := stats.Counters("metrics")["accepted"]; n == 0 {
		t.Errorf("the listener counted no accepted connection after 5 requests")
	}
	if code, _ := get(t, base+"/nope"); code != 404 {
		t.Errorf("/nope: %d, want 404", code)
	}
	cancel()
	// Closed with ctx: the address refuses from then on.
	testenv.Eventually(t, "the port closed with its context", 10*time.Second, func() error {
		http.DefaultClient.CloseIdleConnections()
		if _, err := http.Get(base + "/healthz"); err == nil {
			return errors.New("still answers")
		}
		return nil
	})
}

func TestATakenAddressIsRefusedNamingTheFlag(t *testing.T) {
	l, err := Listen("--metrics-addr", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = Listen("--metrics-addr", l.Addr().String())
	if err == nil || !strings.Contains(err.Error(), "--metrics-addr "+l.Addr().String()) {
		t.Fatalf("second listen on %s: %v, want an error naming --metrics-addr and the address", l.Addr(), err)
	}
}
