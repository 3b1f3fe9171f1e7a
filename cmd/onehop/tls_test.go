package main

import (
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/pki"
)

func TestDaemonsRefuseToStartWithoutTLSUnlessInsecure(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"controller", "--data-dir", dir, "--client-url", "https://127.0.0.1:2379"},
			"the controller serves etcd and the REST API over TLS with client certificates: pass --tls-ca CA.pem --tls-cert CERT.pem --tls-key KEY.pem"},
		{[]string{"controller", "--data-dir", dir, "--client-url", "http://127.0.0.1:2379"}, "or --insecure"},
		{[]string{"controller", "--data-dir", dir, "--client-url", "https://127.0.0.1:2379", "--insecure"}, "https with --insecure"},
		{[]string{"agent", "--node", "h1", "--etcd-endpoints", "https://192.168.100.1:2379"}, "the agent dials etcd over TLS with client certificates: pass --tls-ca"},
		{[]string{"agent", "--node", "h1", "--etcd-endpoints", "http://192.168.100.1:2379", "--tls-ca", "a", "--tls-cert", "b", "--tls-key", "c"}, "plain http needs --insecure"},
		{[]string{"agent", "--node", "h1", "--etcd-endpoints", "http://192.168.100.1:2379", "--tls-ca", "a", "--insecure"}, "--insecure contradicts"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			if err := run(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
		})
	}
	if left, _ := os.ReadDir(dir); len(left) > 0 {
		t.Errorf("a refused controller left %v in its data dir", left)
	}
}

// fakeLab writes the state and PKI of a lab named name under root, as `lab
// up` lays them out, and returns its state and the token.
func fakeLab(t *testing.T, root, name string) (*lab.State, string) {
	t.Helper()
	st := &lab.State{Name: name, Dir: filepath.Join(root, name), Phase: "up"}
	if err := os.MkdirAll(lab.PKIDir(st), 0o700); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(st)
	if err := os.WriteFile(filepath.Join(st.Dir, "lab.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca, err := pki.NewCA("lab", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Write(lab.CAFile(st), filepath.Join(lab.PKIDir(st), "ca.key")); err != nil {
		t.Fatal(err)
	}
	p, err := ca.Issue(pki.Request{Kind: pki.Server, CommonName: "controller", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}, now)
	if err != nil {
		t.Fatal(err)
	}
	f := lab.TLSFiles(st, "controller")
	if err := p.Write(f.Cert, f.Key); err != nil {
		t.Fatal(err)
	}
	tok, err := pki.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteToken(lab.TokenFile(st), tok); err != nil {
		t.Fatal(err)
	}
	return st, tok
}

func TestHTTPSClientTakesTheLabsCAAndTokenUnlessGivenOthers(t *testing.T) {
	root := t.TempDir()
	st, tok := fakeLab(t, root, "l1")
	apiTLS.ca, apiTLS.cert, apiTLS.key, apiTLS.tokenFile = "", "", "", ""
	t.Cleanup(func() { apiTLS.ca, apiTLS.tokenFile = "", "" })

	c, err := clientCredentials(root, "")
	if err != nil || c.files.CA != lab.CAFile(st) || c.token != tok {
		t.Fatalf("from the lab: %+v %v; want CA %s and the lab's token", c, err, lab.CAFile(st))
	}
	c, err = clientCredentials(root, "from-the-environment-0123")
	if err != nil || c.token != "from-the-environment-0123" || c.files.CA != lab.CAFile(st) {
		t.Errorf("ONEHOP_TOKEN: %+v %v", c, err)
	}
	other := filepath.Join(t.TempDir(), "token")
	if err := pki.WriteToken(other, "from-a-file-0123456789"); err != nil {
		t.Fatal(err)
	}
	apiTLS.tokenFile = other
	if c, err = clientCredentials(root, "from-the-environment-0123"); err != nil || c.token != "from-a-file-0123456789" {
		t.Errorf("--token-file over ONEHOP_TOKEN: %+v %v", c, err)
	}
	apiTLS.tokenFile = ""

	// No lab, no flags: say what to pass.
	if _, err := clientCredentials(t.TempDir(), ""); err == nil || !strings.Contains(err.Error(), "--ca and --token-file") {
		t.Errorf("nothing to go on: %v", err)
	}
	apiTLS.cert = "c.crt"
	if _, err := clientCredentials(root, ""); err == nil || !strings.Contains(err.Error(), "--cert and --key go together") {
		t.Errorf("--cert without --key: %v", err)
	}
	apiTLS.cert = ""
}

func TestCLIVerbsReachAnHTTPSAPIWithItsTokenAndAreRefusedWithAnother(t *testing.T) {
	root := t.TempDir()
	st, tok := fakeLab(t, root, "l1")

	var got string
	h := controller.Authenticated(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.URL.Path
		w.Write([]byte("[]"))
	}), tok)
	srv := httptest.NewUnstartedServer(h)
	tc, err := lab.TLSFiles(st, "controller").ServerConfig(tls.VerifyClientCertIfGiven)
	if err != nil {
		t.Fatal(err)
	}
	srv.TLS = tc
	srv.StartTLS()
	defer srv.Close()
	url := srv.URL // https://127.0.0.1:PORT, which the certificate names

	if err := run("get", "vms", "--api", url, "--ca", lab.CAFile(st), "--token-file", lab.TokenFile(st)); err != nil || got != "/v1/vms" {
		t.Fatalf("get vms over https with the token: %v (server saw %q)", err, got)
	}
	bad := filepath.Join(t.TempDir(), "bad-token")
	if err := pki.WriteToken(bad, strings.Repeat("x", 64)); err != nil {
		t.Fatal(err)
	}
	got = ""
	err = run("get", "vms", "--api", url, "--ca", lab.CAFile(st), "--token-file", bad)
	if err == nil || !strings.Contains(err.Error(), "HTTP 401") || !strings.Contains(err.Error(), "--token-file") || got != "" {
		t.Errorf("wrong token: %v (server handler saw %q)", err, got)
	}
}
