package controller

import (
	"net/http"

	"github.com/onehop/onehop/internal/intent"
)

// hostRoutes serves the hosts the topology or the operator put in the store.
func (c *Controller) hostRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/hosts", c.list(intent.HostsPrefix, func() any { return &[]intent.Host{} }))
}
