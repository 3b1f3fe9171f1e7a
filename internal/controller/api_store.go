package controller

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// storeRoutes serves the store's status (GET /v1/store).
func (c *Controller) storeRoutes(mux *router) {
	mux.HandleFunc("GET /v1/store", func(w http.ResponseWriter, r *http.Request) {
		if c.maint == nil {
			writeJSON(w, http.StatusServiceUnavailable, FieldError{Field: "store", Msg: "this controller's store has no database to report on (not etcd)"})
			return
		}
		writeJSON(w, http.StatusOK, c.maint.Status())
	})
	mux.Handle("GET /metrics", c.metricsHandler())
}

// metricsHandler serves the controller's metrics: the store's figures and
// the listeners' counts (the API's, the location server's), the location
// server's events and the LISP map-server's counters.
func (c *Controller) metricsHandler() http.Handler {
	return promhttp.HandlerFor(c.metricsRegistry(), promhttp.HandlerOpts{})
}

// metricsRegistry holds what the controller's /metrics shows, on the API
// and on its operations port (--metrics-addr) alike.
func (c *Controller) metricsRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c.listeners, lispCollector{c}, locationMetrics{c})
	if c.maint != nil {
		reg.MustRegister(c.maint)
	}
	return reg
}
