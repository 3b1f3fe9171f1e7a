package controller

import (
	"crypto/x509"
	"fmt"
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
// when token is empty). Anything else gets 401 before a handler runs. It
// knows no tenant token: Controller.Authenticate does.
func Authenticated(h http.Handler, token string) http.Handler {
	return authenticate(h, token, nil, nil)
}

// Authenticate is Authenticated with the tenant tokens this controller
// keeps (api_tenants.go): it attaches the identity the credential proves to
// the request (IdentityOf), which the API authorizes each request by
// (authz.go). A certificate with O=onehop-tenant is its CN farm's tenant;
// any other the CA signed is an admin's, as is the bearer token; a tenant
// token is its farm's. A revoked token is unknown at once: 401, as is a
// revoked tenant certificate (api_certs.go).
func (c *Controller) Authenticate(h http.Handler, token string) http.Handler {
	return authenticate(h, token, &c.tokens, &c.certRevs)
}

func authenticate(h http.Handler, token string, tenants *tenantTokens, revoked *certRevocations) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
			cert := r.TLS.VerifiedChains[0][0]
			id := Identity{Via: "cert", Name: cert.Subject.CommonName}
			if farm, ok := pki.TenantFarm(cert); ok {
				if farm == "" {
					writeJSON(w, http.StatusUnauthorized, FieldError{Msg: "a tenant certificate (O=" + pki.TenantOrganization + ") must name its farm as its CN, " + pki.TenantCNPrefix + "FARM"})
					return
				}
				if revoked != nil {
					if rev, ok := revoked.revoked(cert, farm); ok {
						writeJSON(w, http.StatusUnauthorized, FieldError{Msg: revokedCertMsg(cert, farm, rev)})
						return
					}
				}
				id.Farm = farm
			}
			h.ServeHTTP(w, r.WithContext(WithIdentity(r.Context(), id)))
			return
		}
		got, ok := bearer(r)
		if ok && pki.TokenMatches(token, got) {
			h.ServeHTTP(w, r.WithContext(WithIdentity(r.Context(), Identity{Via: "token"})))
			return
		}
		if ok && tenants != nil {
			if t, found := tenants.lookup(got); found {
				h.ServeHTTP(w, r.WithContext(WithIdentity(r.Context(), Identity{Farm: t.Farm, Via: "tenant-token", Name: t.ID})))
				return
			}
		}
		msg := "authentication required: present a client certificate signed by the controller's CA or an Authorization: Bearer token"
		if ok {
			msg = "wrong bearer token: neither the API token nor a tenant token (a revoked one is unknown)"
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="onehop"`)
		writeJSON(w, http.StatusUnauthorized, FieldError{Msg: msg})
	})
}

// revokedCertMsg says why a tenant certificate is refused, and what to do.
func revokedCertMsg(cert *x509.Certificate, farm string, rev CertRevocation) string {
	what := "its serial number was revoked"
	if rev.Serial == "" {
		what = "farm " + farm + "'s certificates issued until then were revoked"
	}
	return fmt.Sprintf("tenant certificate serial %s (farm %s, issued %s) is revoked: %s at %s; ask the operator for a new credential",
		pki.SerialHex(cert), farm, pki.IssuedAt(cert).UTC().Format(time.RFC3339), what, rev.Revoked.Format(time.RFC3339))
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
