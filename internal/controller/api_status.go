package controller

import (
	"github.com/onehop/onehop/internal/intent"
)

// statusRoutes serves what each agent last reported.
func (c *Controller) statusRoutes(mux *router) {
	mux.HandleFunc("GET /v1/status", c.list(intent.StatusPrefix, func() any { return &[]intent.AgentStatus{} }))
}
