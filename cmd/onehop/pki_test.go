package main

import (
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/pki"
)

// handshake runs a TLS handshake between a server and a client config over
// an in-memory pipe and returns the common name of the client certificate
// the server verified.
func handshake(t *testing.T, server, client *tls.Config) (string, error) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	srv := tls.Server(a, server)
	done := make(chan error, 1)
	go func() { done <- srv.Handshake() }()
	cerr := tls.Client(b, client).Handshake()
	if cerr != nil {
		b.Close() // unblock the server
		<-done
		return "", cerr
	}
	// Under TLS 1.3 the client is done before the server has judged its
	// certificate: drain the pipe so the server's alert cannot block it.
	go io.Copy(io.Discard, b)
	if err := <-done; err != nil {
		return "", err
	}
	peers := srv.ConnectionState().PeerCertificates
	if len(peers) == 0 {
		return "", nil
	}
	return peers[0].Subject.CommonName, nil
}

func TestPKIMakesWhatTheControllerAndAgentsAccept(t *testing.T) {
	dir := t.TempDir()
	caDir, h1, h2 := filepath.Join(dir, "ca"), filepath.Join(dir, "h1"), filepath.Join(dir, "h2")
	for _, args := range [][]string{
		{"pki", "ca", "--dir", caDir},
		{"pki", "issue", "controller", "--ca-dir", caDir, "--dir", h1, "--ip", "192.168.77.1", "--dns", "ctl.example"},
		{"pki", "issue", "agent", "h1", "--ca-dir", caDir, "--dir", h1},
		{"pki", "issue", "agent", "h2", "--ca-dir", caDir, "--dir", h2},
		{"pki", "token", "--out", filepath.Join(h1, "api-token")},
	} {
		if err := run(args...); err != nil {
			t.Fatalf("onehop %s: %v", strings.Join(args, " "), err)
		}
	}
	for _, key := range []string{"ca/ca.key", "h1/controller.key", "h1/agent.key", "h2/agent.key", "h1/api-token"} {
		fi, err := os.Stat(filepath.Join(dir, key))
		if err != nil {
			t.Fatal(err)
		}
		if m := fi.Mode().Perm(); m != 0o600 {
			t.Errorf("%s has mode %#o, want 0600", key, m)
		}
	}
	if _, err := pki.ReadToken(filepath.Join(h1, "api-token")); err != nil {
		t.Errorf("the token is not one the controller reads: %v", err)
	}

	// The controller's certificate as the controller loads it (serving
	// etcd and the API, requiring a client certificate) and h2's agent's
	// as the agent loads it (dialing etcd).
	ctl := pki.Files{CA: filepath.Join(h1, "ca.crt"), Cert: filepath.Join(h1, "controller.crt"), Key: filepath.Join(h1, "controller.key")}
	server, err := ctl.ServerConfig(tls.RequireAndVerifyClientCert)
	if err != nil {
		t.Fatalf("the controller's files as the controller reads them: %v", err)
	}
	agent := pki.Files{CA: filepath.Join(h2, "ca.crt"), Cert: filepath.Join(h2, "agent.crt"), Key: filepath.Join(h2, "agent.key")}
	for _, name := range []string{"192.168.77.1", "ctl.example"} {
		client, err := agent.ClientConfig()
		if err != nil {
			t.Fatalf("h2's files as the agent reads them: %v", err)
		}
		client.ServerName = name
		cn, err := handshake(t, server, client)
		if err != nil {
			t.Fatalf("h2's agent dialing the controller as %s: %v", name, err)
		}
		if cn != "h2" {
			t.Errorf("the controller saw the agent as CN %q, want h2", cn)
		}
	}
	// Negative: an address the certificate does not name is refused by
	// the client, so the SANs are what was asked for and no more.
	client, _ := agent.ClientConfig()
	client.ServerName = "192.168.77.9"
	if _, err := handshake(t, server, client); err == nil || !strings.Contains(err.Error(), "192.168.77.9") {
		t.Errorf("dialing an address the certificate does not name: err = %v, want a refusal naming it", err)
	}
	// The controller dials etcd with its own certificate: it is a client
	// one too.
	if _, err := ctl.ClientConfig(); err != nil {
		t.Errorf("the controller's certificate as an etcd client: %v", err)
	}
	// An agent's certificate cannot serve.
	if _, err := agent.ServerConfig(tls.RequireAndVerifyClientCert); err == nil || !strings.Contains(err.Error(), "not for server authentication") {
		t.Errorf("an agent's certificate as a server: err = %v, want refused for its usage", err)
	}
	// A certificate from another CA is refused by the controller.
	other := filepath.Join(dir, "other")
	if err := run("pki", "ca", "--dir", other); err != nil {
		t.Fatal(err)
	}
	if err := run("pki", "issue", "agent", "h3", "--ca-dir", other, "--dir", other); err != nil {
		t.Fatal(err)
	}
	stranger, err := pki.Files{CA: filepath.Join(h1, "ca.crt"), Cert: filepath.Join(other, "agent.crt"), Key: filepath.Join(other, "agent.key")}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	stranger.ServerName = "192.168.77.1"
	if _, err := handshake(t, server, stranger); err == nil {
		t.Error("the controller accepted an agent certificate from another CA")
	}
}

func TestPKIRefusesToReplaceWhatIsThereAndNamesIt(t *testing.T) {
	dir := t.TempDir()
	caDir, out, other := filepath.Join(dir, "ca"), filepath.Join(dir, "out"), filepath.Join(dir, "other")
	for _, args := range [][]string{
		{"pki", "ca", "--dir", caDir},
		{"pki", "ca", "--dir", other},
		{"pki", "issue", "agent", "h1", "--ca-dir", caDir, "--dir", out},
		{"pki", "token", "--out", filepath.Join(out, "api-token")},
	} {
		if err := run(args...); err != nil {
			t.Fatalf("onehop %s: %v", strings.Join(args, " "), err)
		}
	}
	before, err := os.ReadFile(filepath.Join(out, "agent.key"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"pki", "ca", "--dir", caDir}, filepath.Join(caDir, "ca.crt") + " exists: a new CA would invalidate"},
		{[]string{"pki", "issue", "agent", "h1", "--ca-dir", caDir, "--dir", out}, filepath.Join(out, "agent.crt") + " exists: pass --force"},
		{[]string{"pki", "issue", "agent", "h2", "--ca-dir", other, "--dir", out, "--force"}, ""}, // --force replaces, ca.crt included
		{[]string{"pki", "issue", "agent", "h2", "--ca-dir", caDir, "--dir", filepath.Join(dir, "x"), "--days", "0"}, "--days 0"},
		{[]string{"pki", "issue", "controller", "--ca-dir", caDir, "--dir", filepath.Join(dir, "y")}, "give --ip"},
		{[]string{"pki", "issue", "controller", "--ca-dir", caDir, "--dir", filepath.Join(dir, "y"), "--ip", "ctl"}, `--ip "ctl": not an IP address`},
		{[]string{"pki", "issue", "agent", "H1", "--ca-dir", caDir}, `host name "H1"`},
		{[]string{"pki", "issue", "agent", "h1", "--ca-dir", filepath.Join(dir, "none")}, "load the CA (onehop pki ca --dir " + filepath.Join(dir, "none") + " makes one)"},
		{[]string{"pki", "token", "--out", filepath.Join(out, "api-token")}, "api-token exists: pass --force"},
	}
	for _, c := range cases {
		err := run(c.args...)
		if c.want == "" {
			if err != nil {
				t.Errorf("onehop %s: %v", strings.Join(c.args, " "), err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("onehop %s: err = %v, want it to contain %q", strings.Join(c.args, " "), err, c.want)
		}
	}
	// Now out/ca.crt is the other CA's: issuing there from the first CA
	// without --force is refused, since the daemon would trust the wrong CA.
	err = run("pki", "issue", "controller", "--ca-dir", caDir, "--dir", out, "--ip", "10.0.0.1")
	if want := "another CA's certificate"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("issuing beside another CA's ca.crt: err = %v, want %q", err, want)
	}
	after, _ := os.ReadFile(filepath.Join(out, "agent.key"))
	if string(after) == string(before) {
		t.Error("--force did not replace agent.key")
	}
}
