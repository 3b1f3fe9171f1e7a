// Package opsport is every daemon's operations port, written once: the
// controller's, the agent's, the gateway's, the xTR's and the VNAT
// daemon's --metrics-addr serves
//
//	/metrics  the daemon's Prometheus metrics, and onehop_build_info
//	/healthz  200 while the process serves at all (liveness)
//	/readyz   200 when the daemon says it is ready, else 503 and why
//	/version  the binary's version.Info as JSON
//
// on a listener bounded like every metrics port (accept.MetricsLimits), with
// the timeouts of every onehop HTTP server. docs/operations.md says what
// each daemon's readiness means.
package opsport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/version"
)

// Config is what one daemon serves on its port.
type Config struct {
	// Daemon names it in the logs and in onehop_build_info's daemon label
	// (controller, agent, gateway, xtr, vnat).
	Daemon string
	// Gatherer is the daemon's metrics (a prometheus.Registry); nil: only
	// onehop_build_info.
	Gatherer prometheus.Gatherer
	// Ready says why the daemon is not ready yet (nil error: ready); nil
	// Ready: ready while it serves.
	Ready func() error
	// Stats counts the listener (onehop_listener_* with name "metrics");
	// nil: not counted.
	Stats *accept.Stats
	Log   *slog.Logger
}

// Listen opens addr for the port; flag names the option in the error (a
// bad or taken address fails before anything else starts).
func Listen(flag, addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", flag, addr, err)
	}
	return l, nil
}

// Handler is the port's HTTP handler.
func Handler(c Config) http.Handler {
	build := prometheus.NewRegistry()
	build.MustRegister(BuildInfo(c.Daemon))
	gs := prometheus.Gatherers{build}
	if c.Gatherer != nil {
		gs = append(gs, c.Gatherer)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gs, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if c.Ready != nil {
			if err := c.Ready(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "not ready: %v\n", err)
				return
			}
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(version.Get()) //nolint:errcheck // the client went away
	})
	return mux
}

// Serve serves c on l until ctx ends, then closes l. It returns at once.
func Serve(ctx context.Context, l net.Listener, c Config) {
	log := c.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	srv := accept.HTTPServer(Handler(c))
	wl := accept.Wrap(l, accept.Options{Name: "metrics", Limits: accept.MetricsLimits, Log: log, Stats: c.Stats})
	go func() {
		<-ctx.Done()
		srv.Close() //nolint:errcheck // shutting down
	}()
	go func() {
		if err := srv.Serve(wl); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("operations port stopped", "daemon", c.Daemon, "err", err)
		}
	}()
	log.Info("serving /metrics, /healthz, /readyz, /version", "daemon", c.Daemon, "addr", l.Addr().String())
}

// BuildInfo is the gauge onehop_build_info{daemon,version,commit,go,bpf} 1:
// a dashboard joins on it to show which version each daemon runs.
func BuildInfo(daemon string) prometheus.Collector {
	v := version.Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "onehop_build_info",
		Help: "1, labelled with the daemon's release, commit, Go version and BPF objects' digest (onehop version).",
		ConstLabels: prometheus.Labels{"daemon": daemon, "version": v.Version, "commit": v.Commit,
			"go": v.Go, "bpf": v.BPF},
	})
	g.Set(1)
	return g
}
