package pki

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func newCA(t *testing.T) *CA {
	t.Helper()
	ca, err := NewCA("onehop test CA", now, DefaultValidity)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issue(t *testing.T, ca *CA, req Request) *Pair {
	t.Helper()
	p, err := ca.Issue(req, now)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestServerCertificateNamesItsAddressesAndServesAndDialsButClientCertificateOnlyDials(t *testing.T) {
	ca := newCA(t)
	srv := issue(t, ca, Request{Kind: Server, CommonName: "controller",
		IPs: []netip.Addr{netip.MustParseAddr("192.168.100.1"), netip.MustParseAddr("127.0.0.1")}, DNSNames: []string{"localhost"}})
	for _, name := range []string{"192.168.100.1", "127.0.0.1", "localhost"} {
		if err := srv.Cert.VerifyHostname(name); err != nil {
			t.Errorf("server certificate does not name %s: %v", name, err)
		}
	}
	if err := srv.Cert.VerifyHostname("192.168.100.2"); err == nil {
		t.Error("server certificate names an address it was not issued for")
	}
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if err := ca.Verify(srv.Cert, u, now); err != nil {
			t.Errorf("server certificate, usage %v: %v", u, err)
		}
	}
	agent := issue(t, ca, Request{Kind: Client, CommonName: "h1"})
	if agent.Cert.Subject.CommonName != "h1" {
		t.Errorf("agent certificate CN = %q, want the node name h1", agent.Cert.Subject.CommonName)
	}
	if err := ca.Verify(agent.Cert, x509.ExtKeyUsageClientAuth, now); err != nil {
		t.Errorf("agent certificate as a client: %v", err)
	}
	if err := ca.Verify(agent.Cert, x509.ExtKeyUsageServerAuth, now); err == nil {
		t.Error("an agent's client certificate verifies as a server certificate")
	}
	if err := ca.Verify(agent.Cert, x509.ExtKeyUsageClientAuth, now.Add(2*DefaultValidity)); err == nil {
		t.Error("certificate verifies after it expired")
	}
	other := newCA(t)
	if err := other.Verify(agent.Cert, x509.ExtKeyUsageClientAuth, now); err == nil {
		t.Error("a certificate verifies against a CA that did not sign it")
	}
}

func TestIssueRefusesWhatCannotWork(t *testing.T) {
	ca := newCA(t)
	if _, err := ca.Issue(Request{Kind: Server, CommonName: "controller"}, now); err == nil || !strings.Contains(err.Error(), "no IP or DNS name") {
		t.Errorf("server certificate without a name to serve on: %v", err)
	}
	if _, err := ca.Issue(Request{Kind: Client}, now); err == nil || !strings.Contains(err.Error(), "empty common name") {
		t.Errorf("certificate without a common name: %v", err)
	}
	p := issue(t, ca, Request{Kind: Client, CommonName: "h1", Validity: 10 * DefaultValidity})
	if p.Cert.NotAfter.After(ca.Cert.NotAfter) {
		t.Errorf("leaf outlives its CA: %v > %v", p.Cert.NotAfter, ca.Cert.NotAfter)
	}
}

// writePKI writes a CA, a server pair and an agent pair into dir.
func writePKI(t *testing.T, dir string) (caFile string, server, agent Files) {
	t.Helper()
	ca := newCA(t)
	caFile = filepath.Join(dir, "ca.crt")
	if err := ca.Write(caFile, filepath.Join(dir, "ca.key")); err != nil {
		t.Fatal(err)
	}
	server = Files{CA: caFile, Cert: filepath.Join(dir, "controller.crt"), Key: filepath.Join(dir, "controller.key")}
	if err := issue(t, ca, Request{Kind: Server, CommonName: "controller", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}).Write(server.Cert, server.Key); err != nil {
		t.Fatal(err)
	}
	agent = Files{CA: caFile, Cert: filepath.Join(dir, "agent-h1.crt"), Key: filepath.Join(dir, "agent-h1.key")}
	if err := issue(t, ca, Request{Kind: Client, CommonName: "h1"}).Write(agent.Cert, agent.Key); err != nil {
		t.Fatal(err)
	}
	return caFile, server, agent
}

func TestKeysAreWritten0600AndReadBack(t *testing.T) {
	dir := t.TempDir()
	caFile, server, agent := writePKI(t, dir)
	want := map[string]os.FileMode{caFile: 0o644, filepath.Join(dir, "ca.key"): 0o600,
		server.Cert: 0o644, server.Key: 0o600, agent.Cert: 0o644, agent.Key: 0o600}
	for path, mode := range want {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %#o, want %#o", filepath.Base(path), fi.Mode().Perm(), mode)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) > 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
	ca, err := LoadCA(caFile, filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	// The CA read back still signs: an operator can issue more later.
	more := issue(t, ca, Request{Kind: Client, CommonName: "h2"})
	if err := ca.Verify(more.Cert, x509.ExtKeyUsageClientAuth, now); err != nil {
		t.Error(err)
	}
	if _, err := LoadCA(agent.Cert, agent.Key); err == nil || !strings.Contains(err.Error(), "not a CA") {
		t.Errorf("a leaf loaded as a CA: %v", err)
	}
}

func TestSecretsOthersCanReadAreRefused(t *testing.T) {
	dir := t.TempDir()
	_, _, agent := writePKI(t, dir)
	if err := os.Chmod(agent.Key, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.ClientConfig(); err == nil || !strings.Contains(err.Error(), "chmod 600 "+agent.Key) {
		t.Errorf("key readable by group: %v", err)
	}
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte(strings.Repeat("a", 32)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadToken(tok); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("token readable by others: %v", err)
	}
}

func TestTokens(t *testing.T) {
	dir := t.TempDir()
	tok, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "token")
	if err := WriteToken(path, tok); err != nil {
		t.Fatal(err)
	}
	got, err := ReadToken(path)
	if err != nil || got != tok {
		t.Fatalf("read back %q, %v; want %q", got, err, tok)
	}
	if !TokenMatches(tok, got) || TokenMatches(tok, tok[:len(tok)-1]) || TokenMatches(tok, tok+"x") || TokenMatches("", "") {
		t.Error("TokenMatches accepts a token that differs, or an empty one")
	}
	for name, content := range map[string]string{
		"short":    "abc\n",
		"empty":    "",
		"space":    "0123456789 abcdef0123",
		"control":  "0123456789\x01abcdef0123",
		"nonascii": "0123456789abcdéf0123",
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadToken(p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("token %s accepted or error does not name the file: %v", name, err)
		}
	}
}

// handshake runs a real TLS handshake over an in-memory pipe.
func handshake(t *testing.T, server, client *tls.Config) (peer *x509.Certificate, serverErr, clientErr error) {
	t.Helper()
	sc, cc := net.Pipe()
	s := tls.Server(sc, server)
	c := tls.Client(cc, client)
	done := make(chan error, 1)
	go func() {
		err := s.Handshake()
		if err == nil {
			// TLS 1.3 clients learn the server refused their certificate
			// only on their first read.
			_, err = s.Write([]byte("ok"))
		}
		sc.Close()
		done <- err
	}()
	clientErr = c.Handshake()
	if clientErr == nil {
		buf := make([]byte, 2)
		_, clientErr = c.Read(buf)
	}
	cc.Close()
	serverErr = <-done
	if serverErr == nil && len(s.ConnectionState().PeerCertificates) > 0 {
		peer = s.ConnectionState().PeerCertificates[0]
	}
	return peer, serverErr, clientErr
}

func TestHandshakeNeedsAClientCertificateFromTheCA(t *testing.T) {
	_, server, agent := writePKI(t, t.TempDir())
	_, _, stranger := writePKI(t, t.TempDir()) // another CA's agent
	sconf, err := server.ServerConfig(tls.RequireAndVerifyClientCert)
	if err != nil {
		t.Fatal(err)
	}
	sconf.ServerName = "127.0.0.1"
	dial := func(f Files) *tls.Config {
		c, err := f.ClientConfig()
		if err != nil {
			t.Fatal(err)
		}
		c.ServerName = "127.0.0.1"
		return c
	}

	if peer, serr, cerr := handshake(t, sconf, dial(agent)); serr != nil || cerr != nil || peer == nil || peer.Subject.CommonName != "h1" {
		t.Errorf("agent's certificate: server %v, client %v, peer %v", serr, cerr, peer)
	}
	// The controller dials etcd with its server certificate.
	if _, serr, cerr := handshake(t, sconf, dial(server)); serr != nil || cerr != nil {
		t.Errorf("controller's certificate as a client: server %v, client %v", serr, cerr)
	}
	if _, serr, cerr := handshake(t, sconf, dial(Files{CA: agent.CA})); serr == nil || cerr == nil {
		t.Errorf("no client certificate: server %v, client %v; want both to fail", serr, cerr)
	}
	// A certificate from another CA, trusting our CA so only the client side is wrong.
	wrong := dial(stranger)
	wrong.RootCAs = dial(agent).RootCAs
	if _, serr, cerr := handshake(t, sconf, wrong); serr == nil || cerr == nil {
		t.Errorf("another CA's certificate: server %v, client %v; want both to fail", serr, cerr)
	}
	// A client that does not trust the server's CA refuses it.
	if _, _, cerr := handshake(t, sconf, dial(stranger)); cerr == nil {
		t.Error("client accepted a server certificate from a CA it does not trust")
	}
	// An agent's certificate cannot serve.
	if _, err := agent.ServerConfig(tls.RequireAndVerifyClientCert); err == nil || !strings.Contains(err.Error(), "not for server authentication") {
		t.Errorf("client certificate as a server: %v", err)
	}
}

func TestCheckModeNamesTheFlags(t *testing.T) {
	all := Files{CA: "ca", Cert: "c", Key: "k"}
	cases := []struct {
		name     string
		f        Files
		insecure bool
		want     string // "" for no error
	}{
		{"tls", all, false, ""},
		{"insecure", Files{}, true, ""},
		{"nothing", Files{}, false, "pass --tls-ca CA.pem --tls-cert CERT.pem --tls-key KEY.pem"},
		{"both", all, true, "--insecure contradicts"},
		{"half", Files{Cert: "c"}, false, "--tls-ca and --tls-key missing"},
		{"no ca", Files{Cert: "c", Key: "k"}, false, "--tls-ca missing"},
	}
	for _, c := range cases {
		err := c.f.CheckMode(c.insecure, "the agent dials etcd")
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	if err := (Files{}).CheckMode(false, "x"); !strings.Contains(err.Error(), "--insecure") {
		t.Errorf("the refusal does not say how to run without TLS: %v", err)
	}
}

func TestCheckURLMatchesTheMode(t *testing.T) {
	cases := []struct {
		url      string
		insecure bool
		want     string
	}{
		{"https://10.0.0.1:2379", false, ""},
		{"http://10.0.0.1:2379", true, ""},
		{"unix:///run/x.sock", false, ""},
		{"http://10.0.0.1:2379", false, "plain http needs --insecure"},
		{"https://10.0.0.1:2379", true, "https with --insecure"},
		{"https://10.0.0.1", false, "want https://HOST:PORT"},
		{"10.0.0.1:2379", false, "want https://HOST:PORT"},
	}
	for _, c := range cases {
		err := CheckURL("--etcd-endpoints", c.url, c.insecure)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "--etcd-endpoints")) {
			t.Errorf("%s insecure=%v: %v, want %q", c.url, c.insecure, err, c.want)
		}
	}
}
