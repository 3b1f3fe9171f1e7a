package main

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/pki"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// httpsController serves a controller holding farms blue and red over
// https with its real authentication, and returns its URL, the CA file and
// the admin token's file.
func httpsController(t *testing.T) (url, ca, adminToken string) {
	t.Helper()
	st, tok := fakeLab(t, t.TempDir(), "l1")
	topo, err := topology.Parse("t.yaml", []byte(`name: t
hosts: [{name: h1}]
farms: [{name: blue, subnets: [{name: web}]}, {name: red, subnets: [{name: web}]}]
vms: [{name: web1, host: h1, subnet: blue/web}, {name: rweb1, host: h1, subnet: red/web}]
`))
	if err != nil {
		t.Fatal(err)
	}
	c := controller.New(store.NewMemory(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := c.ApplyTopology(t.Context(), topo); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(c.Authenticate(c.API(), tok))
	if srv.TLS, err = lab.TLSFiles(st, "controller").ServerConfig(tls.VerifyClientCertIfGiven); err != nil {
		t.Fatal(err)
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL, lab.CAFile(st), lab.TokenFile(st)
}

// as adds the CA and a token file to every step's arguments.
func as(ca, tokenFile string, steps []cliStep) []cliStep {
	out := make([]cliStep, len(steps))
	for i, st := range steps {
		st.args = append(append([]string{}, st.args...), "--ca", ca, "--token-file", tokenFile)
		out[i] = st
	}
	return out
}

func TestCLITenantTokensActOnTheirFarmAndAreRevoked(t *testing.T) {
	url, ca, admin := httpsController(t)
	dir := t.TempDir()
	blue, red := filepath.Join(dir, "blue.token"), filepath.Join(dir, "red.token")
	runSteps(t, url, as(ca, admin, []cliStep{
		{[]string{"tenant", "token", "create", "--farm", "Blue"}, "--farm: farm name", true},
		{[]string{"tenant", "token", "create", "--farm", "green"}, `farm: no farm "green"`, true},
		{[]string{"tenant", "token", "create", "--farm", "blue", "--out", blue}, "for farm blue: " + blue, false},
		{[]string{"tenant", "token", "create", "--farm", "red", "--out", red}, "for farm red: " + red, false},
		{[]string{"tenant", "token", "create", "--farm", "red", "--out", red}, "exists: pass --force", true},
		{[]string{"tenant", "token", "create", "--farm", "red"}, "shown once", false},
	}))
	out, err := runOut("tenant", "token", "list", "--farm", "blue", "-o", "json", "--api", url, "--ca", ca, "--token-file", admin)
	var toks []controller.TenantToken
	if err != nil || json.Unmarshal([]byte(out), &toks) != nil || len(toks) != 1 || toks[0].Farm != "blue" {
		t.Fatalf("token list --farm blue: %v %s", err, out)
	}
	secret, err := pki.ReadToken(blue)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, secret) {
		t.Fatal("the list shows a secret")
	}
	runSteps(t, url, as(ca, blue, []cliStep{
		{[]string{"subnet", "create", "blue/app"}, "", false},
		{[]string{"subnet", "create", "red/app"}, "permission denied: tenant blue", true},
		{[]string{"peer", "red", "blue"}, "permission denied", true},
		{[]string{"get", "vms"}, "", false}, // filtered to blue's: TestTenantListsShowItsOwnFarmOnly
		{[]string{"host", "add", "h9"}, "permission denied", true},
		{[]string{"tenant", "token", "list"}, "permission denied", true},
		{[]string{"audit"}, "tenant blue (token " + toks[0].ID + ")", false},
		{[]string{"audit", "--farm", "red"}, "permission denied", true},
	}))
	runSteps(t, url, as(ca, admin, []cliStep{
		{[]string{"audit", "--farm", "blue", "-o", "json"}, `"name": "blue"`, false},
		{[]string{"tenant", "token", "revoke", toks[0].ID}, "token " + toks[0].ID + " revoked", false},
		{[]string{"tenant", "token", "revoke", toks[0].ID}, "not found", true},
	}))
	runSteps(t, url, as(ca, blue, []cliStep{{[]string{"get", "vms"}, "HTTP 401", true}}))
	runSteps(t, url, as(ca, red, []cliStep{{[]string{"subnet", "create", "red/app"}, "", false}}))
}

// token create -o json prints the record and the token once; with --out
// it names the file and the secret appears nowhere but in the file.
func TestCLITenantTokenCreateJSONLeavesTheSecretOutWithOut(t *testing.T) {
	url, ca, admin := httpsController(t)
	file := filepath.Join(t.TempDir(), "blue.token")
	runSteps(t, url, as(ca, admin, []cliStep{
		{[]string{"tenant", "token", "create", "--farm", "blue", "--out", file, "-o", "json"}, `"file": "` + file + `"`, false},
		{[]string{"tenant", "token", "create", "--farm", "blue", "-o", "json"}, `"token": "`, false},
		{[]string{"tenant", "token", "create", "--farm", "green", "-o", "json"}, `farm: no farm "green"`, true},
	}))
	secret, err := pki.ReadToken(file)
	if err != nil {
		t.Fatal(err)
	}
	// Read whole, the JSON holds the record and the file, not the token.
	file2 := filepath.Join(t.TempDir(), "red.token")
	out, err := runOut("tenant", "token", "create", "--farm", "red", "--out", file2, "-o", "json", "--api", url, "--ca", ca, "--token-file", admin)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("token create --out -o json: %v %s", err, out)
	}
	secret2, err := pki.ReadToken(file2)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got["token"]; ok || strings.Contains(out, secret2) || strings.Contains(out, secret) {
		t.Fatalf("token create --out -o json prints the secret: %s", out)
	}
	if got["farm"] != "red" || got["file"] != file2 || got["id"] == "" || got["created"] == nil {
		t.Fatalf("token create --out -o json: want id, farm red, created and file %s: %s", file2, out)
	}
	if id, _ := got["id"].(string); !strings.Contains(secret2, "."+id+".") {
		t.Errorf("the file's token %q does not carry the printed id %v", secret2, got["id"])
	}

	out, err = runOut("tenant", "token", "create", "--farm", "red", "-o", "json", "--api", url, "--ca", ca, "--token-file", admin)
	if err != nil {
		t.Fatal(err)
	}
	var shown controller.NewTenantToken
	if err := json.Unmarshal([]byte(out), &shown); err != nil || shown.Token == "" || shown.Farm != "red" || shown.ID == "" || shown.Created.IsZero() {
		t.Fatalf("token create -o json: want id, farm red, created and token: %v %s", err, out)
	}
	if strings.Contains(out, `"file"`) {
		t.Errorf("token create -o json without --out names a file: %s", out)
	}
	// The printed token is the real one: it acts on red.
	tokFile := filepath.Join(t.TempDir(), "shown.token")
	if err := pki.WriteToken(tokFile, shown.Token); err != nil {
		t.Fatal(err)
	}
	runSteps(t, url, as(ca, tokFile, []cliStep{
		{[]string{"subnet", "create", "red/app"}, "", false},
		{[]string{"subnet", "create", "blue/app"}, "permission denied: tenant red", true},
	}))
}

func TestCLIPKIIssuesATenantCertificateNamingItsFarm(t *testing.T) {
	dir := t.TempDir()
	caDir := filepath.Join(dir, "ca")
	if err := run("pki", "ca", "--dir", caDir); err != nil {
		t.Fatal(err)
	}
	out, err := runOut("pki", "issue", "tenant", "--farm", "blue", "--ca-dir", caDir, "--dir", dir, "--days", "30")
	if err != nil || !strings.Contains(out, "tenant of farm blue") {
		t.Fatalf("pki issue tenant: %v %s", err, out)
	}
	cert, err := pki.ReadCert(filepath.Join(dir, "tenant-blue.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if farm, ok := pki.TenantFarm(cert); !ok || farm != "blue" {
		t.Errorf("certificate subject %v: want O=%s, CN=tenant:blue", cert.Subject, pki.TenantOrganization)
	}
	if err := run("pki", "issue", "tenant", "--ca-dir", caDir, "--dir", dir); err == nil || !strings.Contains(err.Error(), `"farm" not set`) {
		t.Errorf("no --farm: %v", err)
	}
	if err := run("pki", "issue", "tenant", "--farm", "Blue!", "--ca-dir", caDir, "--dir", dir); err == nil || !strings.Contains(err.Error(), "--farm") {
		t.Errorf("a bad --farm: %v", err)
	}
}

// A tenant certificate issued by `pki issue tenant` acts on its farm until
// `tenant cert revoke --cert` revokes it; the revocation is listed.
func TestCLITenantCertRevokeRefusesTheCertificateFromThenOn(t *testing.T) {
	url, ca, admin := httpsController(t)
	dir := t.TempDir()
	out, err := runOut("pki", "issue", "tenant", "--farm", "blue", "--ca-dir", filepath.Dir(ca), "--dir", dir, "--days", "1", "-o", "json")
	var issued struct{ Cert, Key, Serial string }
	if err != nil || json.Unmarshal([]byte(out), &issued) != nil || issued.Serial == "" {
		t.Fatalf("pki issue tenant -o json: %v %s", err, out)
	}
	withCert := func(steps []cliStep) []cliStep {
		for i := range steps {
			steps[i].args = append(steps[i].args, "--ca", ca, "--cert", issued.Cert, "--key", issued.Key)
		}
		return steps
	}
	runSteps(t, url, withCert([]cliStep{{[]string{"subnet", "create", "blue/app"}, "", false}}))
	runSteps(t, url, as(ca, admin, []cliStep{
		{[]string{"tenant", "cert", "revoke"}, "exactly one of --serial, --cert and --farm", true},
		{[]string{"tenant", "cert", "revoke", "--serial", "12", "--farm", "blue"}, "exactly one", true},
		{[]string{"tenant", "cert", "revoke", "--serial", "zz:1"}, `--serial: serial "zz:1"`, true},
		{[]string{"tenant", "cert", "revoke", "--cert", filepath.Join(dir, "nope.crt")}, "--cert", true},
		{[]string{"tenant", "cert", "revoke", "--cert", filepath.Join(filepath.Dir(ca), "controller.crt")}, "not a tenant's certificate", true},
		{[]string{"tenant", "cert", "revoke", "--cert", issued.Cert}, "tenant certificate serial " + issued.Serial + " revoked", false},
		{[]string{"tenant", "cert", "list"}, issued.Serial, false},
	}))
	runSteps(t, url, withCert([]cliStep{{[]string{"get", "vms"}, "serial " + issued.Serial + " (farm blue", true}}))
	out, err = runOut("tenant", "cert", "list", "-o", "json", "--api", url, "--ca", ca, "--token-file", admin)
	var revs []controller.CertRevocation
	if err != nil || json.Unmarshal([]byte(out), &revs) != nil || len(revs) != 1 || revs[0].Serial != issued.Serial || revs[0].Farm != "blue" || revs[0].Expires.IsZero() {
		t.Fatalf("tenant cert list -o json: %v %s", err, out)
	}
}
