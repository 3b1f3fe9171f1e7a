package controller

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/pki"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/testenv"
)

// testPKI is a CA with the controller's and an agent's files, and a token.
type testPKI struct {
	controller, agent, stranger pki.Files
	token, tokenFile            string
}

func makePKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	write := func(ca *pki.CA, caFile, name string, req pki.Request) pki.Files {
		p, err := ca.Issue(req, now)
		if err != nil {
			t.Fatal(err)
		}
		f := pki.Files{CA: caFile, Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key")}
		if err := p.Write(f.Cert, f.Key); err != nil {
			t.Fatal(err)
		}
		return f
	}
	newCA := func(name string) (*pki.CA, string) {
		ca, err := pki.NewCA(name, now, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, name+".crt")
		if err := ca.Write(f, filepath.Join(dir, name+".key")); err != nil {
			t.Fatal(err)
		}
		return ca, f
	}
	ca, caFile := newCA("ca")
	other, otherFile := newCA("other-ca")
	p := testPKI{
		controller: write(ca, caFile, "controller", pki.Request{Kind: pki.Server, CommonName: "controller",
			IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}),
		agent: write(ca, caFile, "agent-h1", pki.Request{Kind: pki.Client, CommonName: "h1"}),
		// Another CA's agent: a certificate, just not one the controller trusts.
		stranger:  write(other, otherFile, "stranger", pki.Request{Kind: pki.Client, CommonName: "h1"}),
		tokenFile: filepath.Join(dir, "api-token"),
	}
	p.stranger.CA = caFile // it trusts the controller; only its own certificate is wrong
	var err error
	if p.token, err = pki.NewToken(); err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteToken(p.tokenFile, p.token); err != nil {
		t.Fatal(err)
	}
	return p
}

func clientTLS(t *testing.T, f pki.Files) *tls.Config {
	t.Helper()
	c, err := f.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// forceCert is f's client configuration that offers f's certificate even
// to a server that asks for another CA's (Go's client otherwise sends none).
func forceCert(t *testing.T, f pki.Files) *tls.Config {
	t.Helper()
	c := clientTLS(t, f)
	kp := c.Certificates[0]
	c.Certificates = nil
	c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &kp, nil }
	return c
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestAPIConnectionErrorsAreRateLimitedInTheLog(t *testing.T) {
	var buf strings.Builder
	l := limitedErrorLog(slog.New(slog.NewTextHandler(&buf, nil)), 5)
	for range 1000 {
		l.Printf("http: TLS handshake error from 192.168.100.7:40000: client sent an HTTP request to an HTTPS server")
	}
	if n := strings.Count(buf.String(), "\n"); n != 5 {
		t.Errorf("1000 connection errors in a second wrote %d lines, want 5:\n%s", n, buf.String())
	}
}

func TestControllerRefusesToStartWithoutTLSUnlessInsecure(t *testing.T) {
	files := pki.Files{CA: "ca.crt", Cert: "c.crt", Key: "c.key"}
	base := DaemonConfig{DataDir: "/d", ClientURL: "https://127.0.0.1:2379", TLS: files}
	cases := []struct {
		name string
		edit func(*DaemonConfig)
		want string
	}{
		{"tls", func(c *DaemonConfig) {}, ""},
		{"no tls material", func(c *DaemonConfig) { c.TLS = pki.Files{} }, "pass --tls-ca CA.pem --tls-cert CERT.pem --tls-key KEY.pem"},
		{"no tls, plain url", func(c *DaemonConfig) { c.TLS = pki.Files{}; c.ClientURL = "http://127.0.0.1:2379" }, "or --insecure"},
		{"insecure", func(c *DaemonConfig) { c.TLS = pki.Files{}; c.Insecure = true; c.ClientURL = "http://127.0.0.1:2379" }, ""},
		{"insecure and tls", func(c *DaemonConfig) { c.Insecure = true }, "--insecure contradicts"},
		{"key missing", func(c *DaemonConfig) { c.TLS.Key = "" }, "--tls-key missing"},
		{"tls, http url", func(c *DaemonConfig) { c.ClientURL = "http://127.0.0.1:2379" }, `--client-url "http://127.0.0.1:2379": plain http needs --insecure`},
		{"insecure, https url", func(c *DaemonConfig) { c.TLS = pki.Files{}; c.Insecure = true }, "--client-url"},
		{"insecure token", func(c *DaemonConfig) {
			c.TLS = pki.Files{}
			c.Insecure = true
			c.ClientURL = "http://127.0.0.1:2379"
			c.APITokenFile = "t"
		}, "--api-token-file with --insecure"},
		{"external plain", func(c *DaemonConfig) { c.EtcdEndpoints = []string{"http://10.0.0.5:2379"} }, `--etcd-endpoints "http://10.0.0.5:2379": plain http needs --insecure`},
		{"external tls", func(c *DaemonConfig) { c.EtcdEndpoints = []string{"https://10.0.0.5:2379"} }, ""},
	}
	for _, c := range cases {
		cfg := base
		c.edit(&cfg)
		err := cfg.Validate()
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	// RunDaemon validates before it creates or listens on anything.
	cfg := base
	cfg.TLS = pki.Files{}
	cfg.DataDir = filepath.Join(t.TempDir(), "etcd")
	if err := RunDaemon(t.Context(), cfg, discard); err == nil || !strings.Contains(err.Error(), "--insecure") {
		t.Fatalf("RunDaemon without TLS: %v", err)
	}
	if _, err := os.Stat(cfg.DataDir); err == nil {
		t.Error("RunDaemon refused to start but made its data dir")
	}
}

func TestControllerNamesAnUnreadableTLSFile(t *testing.T) {
	p := makePKI(t)
	cfg := DaemonConfig{DataDir: filepath.Join(t.TempDir(), "etcd"), ClientURL: "https://127.0.0.1:1", TLS: p.controller}
	cfg.TLS.Key = filepath.Join(t.TempDir(), "nope.key")
	if err := RunDaemon(t.Context(), cfg, discard); err == nil || !strings.Contains(err.Error(), "nope.key") {
		t.Errorf("missing key file: %v", err)
	}
	cfg.TLS = p.agent // a client certificate cannot serve
	if err := RunDaemon(t.Context(), cfg, discard); err == nil || !strings.Contains(err.Error(), "not for server authentication") {
		t.Errorf("agent certificate as the controller's: %v", err)
	}
	cfg.TLS, cfg.APITokenFile = p.controller, filepath.Join(t.TempDir(), "missing-token")
	if err := RunDaemon(t.Context(), cfg, discard); err == nil || !strings.Contains(err.Error(), "--api-token-file") {
		t.Errorf("missing token file: %v", err)
	}
}

// tlsController runs a controller with TLS on loopback: embedded etcd on
// https, the API on TCP (TLS) and on a unix socket.
func tlsController(t *testing.T) (p testPKI, clientURL, apiURL, apiSocket, etcdSocket string) {
	t.Helper()
	p = makePKI(t)
	dir := t.TempDir()
	clientURL = fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
	apiAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	apiSocket, etcdSocket = filepath.Join(dir, "api.sock"), filepath.Join(dir, "etcd.sock")
	cfg := DaemonConfig{DataDir: filepath.Join(dir, "etcd"), ClientURL: clientURL, Socket: etcdSocket,
		PeerURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), Topology: writeTopo(t),
		APISocket: apiSocket, APIListen: apiAddr, TLS: p.controller, APITokenFile: p.tokenFile}
	exited := startController(t, cfg)
	// The agent's certificate reads the intent: agents get in.
	waitVMs(t, exited, []string{clientURL}, clientTLS(t, p.agent))
	// The API starts listening after etcd holds the topology: a test that
	// asks it at once could find nothing listening yet.
	testenv.Eventually(t, "the TCP API to listen", 20*time.Second, func() error {
		c, err := net.DialTimeout("tcp", apiAddr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	return p, clientURL, "https://" + apiAddr, apiSocket, etcdSocket
}

func TestEmbeddedEtcdTakesOnlyClientsWithACertificateFromTheCA(t *testing.T) {
	p, clientURL, _, _, etcdSocket := tlsController(t)

	// An agent writes its status with its own certificate.
	agent, err := store.DialEtcdTLS([]string{clientURL}, clientTLS(t, p.agent))
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	if err := store.PutJSON(t.Context(), agent, intent.StatusPrefix+"h1", intent.AgentStatus{Node: "h1"}); err != nil {
		t.Fatalf("agent with its certificate: %v", err)
	}

	refused := func(what string, tc *tls.Config, url string) {
		t.Helper()
		s, err := store.DialEtcdTLS([]string{url}, tc)
		if err != nil {
			return // refused at dial: fine
		}
		defer s.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		if _, _, err := s.List(ctx, intent.VMsPrefix); err == nil {
			t.Errorf("%s: etcd answered", what)
		}
	}
	refused("no client certificate", clientTLS(t, pki.Files{CA: p.agent.CA}), clientURL)
	refused("another CA's certificate", forceCert(t, p.stranger), clientURL)
	refused("plain http", nil, strings.Replace(clientURL, "https://", "http://", 1))

	// A raw handshake without a certificate fails at the TLS layer, before
	// any etcd code runs (what curl from the fabric sees).
	addr := strings.TrimPrefix(clientURL, "https://")
	tc := clientTLS(t, pki.Files{CA: p.agent.CA})
	conn, err := tls.Dial("tcp", addr, tc)
	if err == nil {
		conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		_, err = conn.Read(make([]byte, 1)) // TLS 1.3 reports the refusal on the first read
		conn.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Errorf("handshake without a client certificate: %v, want the server to require one", err)
	}

	// The unix socket for local tools is plain, and only root may use it.
	fi, err := os.Stat(etcdSocket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("etcd socket mode %#o, want 0600", fi.Mode().Perm())
	}
	local, err := store.DialEtcd([]string{"unix://" + etcdSocket})
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	var st intent.AgentStatus
	if err := store.GetJSON(t.Context(), local, intent.StatusPrefix+"h1", &st); err != nil || st.Node != "h1" {
		t.Errorf("local tool over the unix socket: %v %+v", err, st)
	}
}

func TestAPIOverTCPNeedsTheTokenOrAClientCertificate(t *testing.T) {
	p, _, apiURL, apiSocket, _ := tlsController(t)
	get := func(tc *tls.Config, auth string) (int, string) {
		t.Helper()
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 5 * time.Second}
		req, _ := http.NewRequest("GET", apiURL+"/v1/vms", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET with auth %q: %v", auth, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	caOnly := clientTLS(t, pki.Files{CA: p.agent.CA})
	cases := []struct {
		name string
		tc   *tls.Config
		auth string
		code int
		body string
	}{
		{"nothing", caOnly, "", 401, "authentication required"},
		{"wrong token", caOnly, "Bearer " + strings.Repeat("0", len(p.token)), 401, "wrong bearer token"},
		{"token prefix", caOnly, "Bearer " + p.token[:len(p.token)-1], 401, "wrong bearer token"},
		{"token, wrong scheme", caOnly, "Basic " + p.token, 401, "authentication required"},
		{"right token", caOnly, "Bearer " + p.token, 200, "web1"},
		{"client certificate", clientTLS(t, p.agent), "", 200, "web1"},
	}
	for _, c := range cases {
		code, body := get(c.tc, c.auth)
		if code != c.code || !strings.Contains(body, c.body) {
			t.Errorf("%s: HTTP %d %s; want %d with %q", c.name, code, body, c.code, c.body)
		}
	}
	// A client holding only another CA's certificate does not offer it
	// (the server names its CA), so it is a client without one: 401.
	if code, _ := get(clientTLS(t, p.stranger), ""); code != 401 {
		t.Errorf("another CA's certificate, not offered: HTTP %d, want 401", code)
	}
	// Offered anyway, it fails the handshake.
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: forceCert(t, p.stranger)}, Timeout: 5 * time.Second}
	if resp, err := c.Get(apiURL + "/v1/vms"); err == nil {
		resp.Body.Close()
		t.Errorf("another CA's certificate, offered: HTTP %d, want a failed handshake", resp.StatusCode)
	}
	// Plain HTTP to the TLS port gets no API.
	if resp, err := http.Get(strings.Replace(apiURL, "https://", "http://", 1) + "/v1/vms"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Errorf("plain http on the TLS port: HTTP 200 %s", b)
		}
	}

	// The unix socket needs no credentials; its mode keeps it to root.
	fi, err := os.Stat(apiSocket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("api socket mode %#o, want 0600", fi.Mode().Perm())
	}
	uc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", apiSocket)
	}}}
	resp, err := uc.Get("http://onehop/v1/vms")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("api over the unix socket: HTTP %d", resp.StatusCode)
	}
}

// externalEtcd runs Debian's etcd on loopback, taking only clients with a
// certificate of p's CA, until the test ends; it returns its client URL.
func externalEtcd(t *testing.T, p testPKI) string {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		testenv.Missing(t, "needs an etcd binary on PATH (Debian etcd-server; make deps installs it): %v", err)
	}
	client := fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	cmd := exec.Command(bin, "--data-dir", filepath.Join(t.TempDir(), "ext"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "default="+peer,
		"--cert-file", p.controller.Cert, "--key-file", p.controller.Key,
		"--trusted-ca-file", p.controller.CA, "--client-cert-auth")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return client
}

func TestControllerDialsAnExternalEtcdClusterWithItsCertificate(t *testing.T) {
	p := makePKI(t)
	client := externalEtcd(t, p)
	runUntilVMs(t, DaemonConfig{EtcdEndpoints: []string{client}, Topology: writeTopo(t), TLS: p.controller},
		[]string{client}, clientTLS(t, p.agent))
}
