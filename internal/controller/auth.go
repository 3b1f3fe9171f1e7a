package controller

import (
	stdlog "log"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/pki"
)

// Authenticated wraps the REST API for its TCP listener, which anyone on the
// fabric can reach. A request passes if its TLS connection presented a
// client certificate the CA signed (the TLS layer has verified it by then)
// or if it carries the bearer token ("Authorization: Bearer TOKEN"; no token
// when token is empty). Anything else gets 401 before a handler runs.
func Authenticated(h http.Handler, token string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
			h.ServeHTTP(w, r)
			return
		}
		got, ok := bearer(r)
		if ok && pki.TokenMatches(token, got) {
			h.ServeHTTP(w, r)
			return
		}
		msg := "authentication required: present a client certificate signed by the controller's CA or an Authorization: Bearer token"
		if ok {
			msg = "wrong bearer token"
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="onehop"`)
		writeJSON(w, http.StatusUnauthorized, FieldError{Msg: msg})
	})
}

// bearer returns the token of an "Authorization: Bearer TOKEN" header.
func bearer(r *http.Request) (string, bool) {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// limitedErrorLog is the API server's error log. Anyone on the fabric can
// make it write (a failed handshake, plain HTTP to the TLS port), so at most
// burst lines a second reach log; the rest are counted into one line.
func limitedErrorLog(log *slog.Logger, burst int) *stdlog.Logger {
	return stdlog.New(&limitedWriter{log: log, burst: burst}, "", 0)
}

type limitedWriter struct {
	log        *slog.Logger
	burst      int
	mu         sync.Mutex
	window     time.Time
	inWindow   int
	suppressed int
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	if now.Sub(w.window) >= time.Second {
		if w.suppressed > 0 {
			w.log.Warn("more REST API connection errors", "unlogged", w.suppressed)
		}
		w.window, w.inWindow, w.suppressed = now, 0, 0
	}
	if w.inWindow >= w.burst {
		w.suppressed++
		return len(p), nil
	}
	w.inWindow++
	w.log.Warn("REST API connection", "err", strings.TrimSpace(string(p)))
	return len(p), nil
}
