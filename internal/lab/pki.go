package lab

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/onehop/onehop/internal/pki"
)

// APIPort is where the lab's controller serves the REST API over TLS on its
// fabric address (local tools use the unix socket instead).
const APIPort = 8443

// PKIDir is where a lab keeps its CA, certificates and API token (the
// directory is 0700, keys and the token 0600).
func PKIDir(st *State) string { return filepath.Join(st.Dir, "pki") }

// CAFile is the lab's CA certificate: what clients verify the controller with.
func CAFile(st *State) string { return filepath.Join(PKIDir(st), "ca.crt") }

// TokenFile holds the bearer token the lab's API accepts.
func TokenFile(st *State) string { return filepath.Join(PKIDir(st), "api-token") }

// TLSFiles are the CA, certificate and key of one lab component: "controller"
// or "agent-HOST".
func TLSFiles(st *State, name string) pki.Files {
	dir := PKIDir(st)
	return pki.Files{CA: CAFile(st), Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key")}
}

// makePKI creates the lab's CA; the controller's certificate for its fabric
// address (and loopback); a client certificate per host, CN = the host's
// name, for its agent; and the API's bearer token.
func (b *builder) makePKI() error {
	dir := PKIDir(b.st)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("lab pki dir: %w", err)
	}
	now := time.Now()
	ca, err := pki.NewCA("onehop lab "+b.t.Name, now, pki.DefaultValidity)
	if err != nil {
		return err
	}
	if err := ca.Write(CAFile(b.st), caKeyFile(b.st)); err != nil {
		return err
	}
	ctl, err := netip.ParseAddr(b.t.Fabric.Controller)
	if err != nil {
		return fmt.Errorf("controller address %q: %w", b.t.Fabric.Controller, err)
	}
	issue := func(name string, req pki.Request) error {
		p, err := ca.Issue(req, now)
		if err != nil {
			return err
		}
		f := TLSFiles(b.st, name)
		return p.Write(f.Cert, f.Key)
	}
	if err := issue("controller", pki.Request{Kind: pki.Server, CommonName: "controller",
		IPs: []netip.Addr{ctl, netip.MustParseAddr("127.0.0.1")}, DNSNames: []string{"localhost"}}); err != nil {
		return err
	}
	for _, h := range b.t.Hosts {
		if err := issueAgentCert(b.st, ca, h.Name, now); err != nil {
			return err
		}
	}
	tok, err := pki.NewToken()
	if err != nil {
		return err
	}
	if err := pki.WriteToken(TokenFile(b.st), tok); err != nil {
		return err
	}
	b.st.APIURL = "https://" + net.JoinHostPort(ctl.String(), fmt.Sprint(APIPort))
	b.step("pki in %s: a CA, the controller's certificate for %s, a client certificate per agent, the API token", dir, ctl)
	return nil
}

// caKeyFile is the lab CA's key: what signs a host added later (AddHost).
func caKeyFile(st *State) string { return filepath.Join(PKIDir(st), "ca.key") }

// issueAgentCert issues host's agent its client certificate, CN = the
// host's name.
func issueAgentCert(st *State, ca *pki.CA, host string, now time.Time) error {
	p, err := ca.Issue(pki.Request{Kind: pki.Client, CommonName: host}, now)
	if err != nil {
		return err
	}
	f := TLSFiles(st, "agent-"+host)
	return p.Write(f.Cert, f.Key)
}

// controllerTLSArgs are the controller's flags for TLS: etcd and the API on
// the fabric take only clients with a certificate from the lab's CA (or,
// for the API, the token).
func (b *builder) controllerTLSArgs() []string {
	f := TLSFiles(b.st, "controller")
	return []string{"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key,
		"--api-listen", net.JoinHostPort(b.t.Fabric.Controller, fmt.Sprint(APIPort)),
		"--api-token-file", TokenFile(b.st)}
}

// agentTLSArgs are an agent's flags for dialing etcd with its own certificate.
func (b *builder) agentTLSArgs(host string) []string {
	f := TLSFiles(b.st, "agent-"+host)
	return []string{"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key}
}
