// Package pkitest is the tests' cluster PKI in memory: a CA, the
// controller's server certificate for 127.0.0.1 and agents' client
// certificates (CN = the node), as internal/pki issues them for the lab,
// plus a stranger's from another CA. No file is written.
package pkitest

import (
	"crypto/tls"
	"crypto/x509"
	"net/netip"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/pki"
)

// PKI is a cluster's CA and what it signed.
type PKI struct {
	t    testing.TB
	ca   *pki.CA
	pool *x509.CertPool
	// Server is the controller's certificate (127.0.0.1).
	Server tls.Certificate
}

// New is a fresh cluster CA and the controller's certificate.
func New(t testing.TB) *PKI {
	t.Helper()
	ca, err := pki.NewCA("test-ca", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := &PKI{t: t, ca: ca, pool: x509.NewCertPool()}
	p.pool.AddCert(ca.Cert)
	p.Server = p.issue(pki.Request{Kind: pki.Server, CommonName: "controller", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
	return p
}

func (p *PKI) issue(req pki.Request) tls.Certificate {
	p.t.Helper()
	pair, err := p.ca.Issue(req, time.Now())
	if err != nil {
		p.t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{pair.Cert.Raw}, PrivateKey: pair.Key, Leaf: pair.Cert}
}

// ServerConfig is the controller's side: its certificate, client
// certificates verified against the CA (and required).
func (p *PKI) ServerConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{p.Server}, ClientCAs: p.pool,
		ClientAuth: tls.RequireAndVerifyClientCert}
}

// Agent is node's agent's side: its client certificate (CN = node), the
// controller verified against the CA at 127.0.0.1.
func (p *PKI) Agent(node string) *tls.Config {
	p.t.Helper()
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: p.pool, ServerName: "127.0.0.1",
		Certificates: []tls.Certificate{p.issue(pki.Request{Kind: pki.Client, CommonName: node})}}
}

// Stranger is an agent of another CA that names itself node and trusts
// this cluster's controller: only its own certificate is wrong. It offers
// it even though the server asks for this CA's (Go's client would send
// none).
func (p *PKI) Stranger(node string) *tls.Config {
	p.t.Helper()
	other := New(p.t)
	kp := other.issue(pki.Request{Kind: pki.Client, CommonName: node})
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: p.pool, ServerName: "127.0.0.1",
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &kp, nil }}
}
