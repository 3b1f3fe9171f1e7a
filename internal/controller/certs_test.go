package controller

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/pki"
	"github.com/onehop/onehop/internal/testenv"
)

// A tenant certificate is revoked by its serial (that one only), by its
// farm (every one issued until then, not one issued after), and by its
// farm's delete; another controller on the same store refuses it as soon
// as its watch sees the record.
func TestTenantCertificatesAreRevokedBySerialByFarmAndWithTheirFarm(t *testing.T) {
	e := newTenantEnv(t)
	p := makePKI(t)
	ca, err := pki.LoadCA(p.agent.CA, strings.TrimSuffix(p.agent.CA, ".crt")+".key")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	issue := func(name, farm string, at time.Time) (pki.Files, string) {
		t.Helper()
		pair, err := ca.Issue(pki.TenantRequest(farm), at)
		if err != nil {
			t.Fatal(err)
		}
		f := pki.Files{CA: p.agent.CA, Cert: dir + "/" + name + ".crt", Key: dir + "/" + name + ".key"}
		if err := pair.Write(f.Cert, f.Key); err != nil {
			t.Fatal(err)
		}
		return f, pki.SerialHex(pair.Cert)
	}
	past := time.Now().Add(-time.Hour)
	blue1, serial1 := issue("blue1", "blue", past)
	blue2, _ := issue("blue2", "blue", past)
	red1, _ := issue("red1", "red", past)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	other := New(e.s, discard)
	rev, err := other.LoadTenantCredentials(ctx)
	if err != nil {
		t.Fatal(err)
	}
	go other.WatchTenantCredentials(ctx, rev)
	serve := func(c *Controller) *httptest.Server {
		srv := httptest.NewUnstartedServer(c.Authenticate(c.API(), ""))
		if srv.TLS, err = p.controller.ServerConfig(tls.VerifyClientCertIfGiven); err != nil {
			t.Fatal(err)
		}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return srv
	}
	here, there := serve(e.c), serve(other)
	get := func(srv *httptest.Server, f pki.Files) (int, string) {
		t.Helper()
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS(t, f)}, Timeout: 5 * time.Second}
		resp, err := c.Get(srv.URL + "/v1/vms")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	for _, f := range []pki.Files{blue1, blue2, red1} {
		if code, out := get(here, f); code != 200 {
			t.Fatalf("%s before any revocation: %d %s", f.Cert, code, out)
		}
	}

	// By serial, as openssl prints it (colons, upper case): blue1 only.
	colons := strings.ToUpper(serial1)
	if len(colons)%2 == 1 {
		colons = "0" + colons
	}
	var parts []string
	for i := 0; i < len(colons); i += 2 {
		parts = append(parts, colons[i:i+2])
	}
	e.must(t, "blue", "POST", "/v1/tenants/cert-revocations", `{"serial":"`+strings.Join(parts, ":")+`"}`, 403)
	e.must(t, "admin", "POST", "/v1/tenants/cert-revocations", `{"serial":"xyz"}`, 400)
	e.must(t, "admin", "POST", "/v1/tenants/cert-revocations", `{}`, 400)
	e.must(t, "admin", "POST", "/v1/tenants/cert-revocations", `{"farm":"Blue"}`, 400)
	e.must(t, "admin", "POST", "/v1/tenants/cert-revocations", `{"serial":"`+strings.Join(parts, ":")+`","farm":"blue"}`, 201)
	if code, out := get(here, blue1); code != 401 || !strings.Contains(out, "serial "+serial1) || !strings.Contains(out, "its serial number was revoked") {
		t.Fatalf("blue1 after its serial's revocation: %d %s", code, out)
	}
	testenv.Eventually(t, "the other controller to refuse blue1", 10*time.Second, func() bool { code, _ := get(there, blue1); return code == 401 })
	if code, out := get(here, blue2); code != 200 {
		t.Fatalf("blue2 after blue1's revocation: %d %s", code, out)
	}

	// By farm: every blue certificate issued until now, not red's, and
	// not one issued after.
	e.must(t, "admin", "POST", "/v1/tenants/cert-revocations", `{"farm":"blue"}`, 201)
	if code, out := get(here, blue2); code != 401 || !strings.Contains(out, "farm blue's certificates issued until then were revoked") {
		t.Fatalf("blue2 after blue's revocation: %d %s", code, out)
	}
	if code, out := get(here, red1); code != 200 {
		t.Fatalf("red1 after blue's revocation: %d %s", code, out)
	}
	later, _ := issue("blue3", "blue", time.Now().Add(2*time.Second))
	if code, out := get(here, later); code != 200 {
		t.Fatalf("a blue certificate issued after blue's revocation: %d %s", code, out)
	}
	testenv.Eventually(t, "the other controller to refuse blue2", 10*time.Second, func() bool { code, _ := get(there, blue2); return code == 401 })
	if code, _ := get(there, later); code != 200 {
		t.Fatalf("the other controller refuses a certificate issued after the revocation: %d", code)
	}

	var list []CertRevocation
	if err := json.Unmarshal(e.must(t, "admin", "GET", "/v1/tenants/cert-revocations?farm=blue", "", 200), &list); err != nil || len(list) != 2 || list[0].Serial != serial1 || list[1].Serial != "" || list[1].Farm != "blue" {
		t.Fatalf("revocations of blue: %+v %v", list, err)
	}

	// A farm's delete revokes its certificates issued until then: red1
	// cannot act on a red made again.
	e.must(t, "admin", "DELETE", "/v1/farms/red?cascade=true", "", 204)
	e.must(t, "admin", "POST", "/v1/farms", `{"name":"red"}`, 201)
	if code, out := get(here, red1); code != 401 || !strings.Contains(out, "farm red's certificates") {
		t.Fatalf("red1 after red's delete and creation: %d %s", code, out)
	}
	// A restarted controller loads the revocations before it serves.
	restarted := New(e.s, discard)
	if _, err := restarted.LoadTenantCredentials(t.Context()); err != nil {
		t.Fatal(err)
	}
	if code, _ := get(serve(restarted), blue1); code != 401 {
		t.Fatalf("a restarted controller lets blue1 in: %d", code)
	}
}

// FuzzAPICertRevocationBody: any body for a certificate revocation is a
// 201 or a 4xx naming its field, never a 5xx (fuzzAPI checks both), and a
// refused one writes no revocation.
func FuzzAPICertRevocationBody(f *testing.F) {
	seedBodies(f, `{"serial":"3a:5b:07"}`, `{"farm":"blue"}`, `{"serial":"ff","farm":"blue","expires":"2030-01-01T00:00:00Z"}`,
		`{"farm":"blue","expires":"2030-01-01T00:00:00Z"}`, `{"serial":"zz"}`, `{"farm":"Blue"}`, `{}`, `{"serial":1}`, `{`, ``, `null`)
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, body string) {
		s, code := send(t, "POST", "/v1/tenants/cert-revocations", body)
		if code == http.StatusCreated {
			return
		}
		if kvs, _, err := s.List(t.Context(), intent.TenantCertRevocationsPrefix); err != nil || len(kvs) != 0 {
			t.Fatalf("POST %q refused (%d) but wrote %d revocations (%v)", body, code, len(kvs), err)
		}
	})
}
