package client

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"testing"
)

const token = "0123456789abcdef0123456789abcdef"

// authSeen serves the API's answer and records the Authorization header.
func authSeen(seen *string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*seen = r.Header.Get("Authorization")
		w.Write([]byte("[]"))
	})
}

func TestTokenIsSentOverHTTPSAndNeverOverPlainHTTP(t *testing.T) {
	var seen string
	srv := httptest.NewTLSServer(authSeen(&seen))
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	if err := NewWith(srv.URL, Options{TLS: &tls.Config{RootCAs: pool}, Token: token}).Do("GET", "/v1/vms", nil, nil); err != nil {
		t.Fatal(err)
	}
	if seen != "Bearer "+token {
		t.Errorf("over https the server saw Authorization %q", seen)
	}

	plain := httptest.NewServer(authSeen(&seen))
	defer plain.Close()
	seen = "unset"
	if err := NewWith(plain.URL, Options{Token: token}).Do("GET", "/v1/vms", nil, nil); err != nil {
		t.Fatal(err)
	}
	if seen != "" {
		t.Errorf("over plain http the token crossed the wire: %q", seen)
	}
}

func TestHTTPSClientRefusesAServerItsCADidNotSign(t *testing.T) {
	var seen string
	srv := httptest.NewTLSServer(authSeen(&seen))
	defer srv.Close()
	err := NewWith(srv.URL, Options{TLS: &tls.Config{RootCAs: x509.NewCertPool()}, Token: token}).Do("GET", "/v1/vms", nil, nil)
	if err == nil || seen != "" {
		t.Errorf("client talked to a server it cannot verify: %v (server saw %q)", err, seen)
	}
}
