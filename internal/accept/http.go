package accept

import (
	"net/http"
	"time"
)

// MetricsLimits bound a metrics port: a scraper or two and a person with
// curl, never hundreds of connections.
var MetricsLimits = Limits{PerSource: 8, Total: 32}

// HTTP timeouts of every onehop HTTP server (HTTPServer).
const (
	// HTTPHeaderTimeout bounds the wait for a request's headers.
	HTTPHeaderTimeout = 5 * time.Second
	// HTTPIdleTimeout bounds a kept-alive connection's wait for its next
	// request.
	HTTPIdleTimeout = 60 * time.Second
)

// HTTPServer is an http.Server for h with the timeouts every onehop HTTP
// listener uses. Serve it on a Listener without Idle: net/http times its
// own waits (a handler that takes long with nothing on the wire is not
// idle), and the Listener's caps and back-off still hold.
func HTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: HTTPHeaderTimeout, IdleTimeout: HTTPIdleTimeout}
}
