package controller

import (
	"net/http"

	"github.com/onehop/onehop/internal/version"
)

// versionRoutes serves the controller's own version (GET /v1/version); each
// agent's is in its status record, so `onehop status` can flag the hosts
// that run another.
func (c *Controller) versionRoutes(mux *router) {
	mux.HandleFunc("GET /v1/version", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, version.Get())
	})
}
