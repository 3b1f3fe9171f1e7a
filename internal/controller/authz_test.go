package controller

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/pki"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/testenv"
	"github.com/onehop/onehop/internal/topology"
)

// tenantTopo is two tenants' farms on one cloud.
const tenantTopo = `name: tenants
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}]
  - name: red
    subnets: [{name: web}, {name: db}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: db1, host: h2, subnet: blue/db}
  - {name: rweb1, host: h1, subnet: red/web}
  - {name: rdb1, host: h2, subnet: red/db}
`

// tenantEnv is a controller behind its real authentication, with the admin
// token and a tenant token for each farm.
type tenantEnv struct {
	c     *Controller
	s     *store.Memory
	srv   *httptest.Server
	token map[string]string // "admin", "blue", "red"
	ids   map[string]string // the tenant tokens' ids
}

func newTenantEnv(t *testing.T) *tenantEnv {
	t.Helper()
	c, s := newController()
	topo, err := topology.Parse("tenants.yaml", []byte(tenantTopo))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ApplyTopology(t.Context(), topo); err != nil {
		t.Fatal(err)
	}
	e := &tenantEnv{c: c, s: s, token: map[string]string{"admin": "the-admin-token-0123456789"}, ids: map[string]string{}}
	for _, f := range []string{"blue", "red"} {
		tok, err := c.CreateTenantToken(t.Context(), f)
		if err != nil {
			t.Fatal(err)
		}
		e.token[f], e.ids[f] = tok.Token, tok.ID
	}
	e.srv = httptest.NewServer(c.Authenticate(c.API(), e.token["admin"]))
	t.Cleanup(e.srv.Close)
	return e
}

// call sends one request with who's token ("" none) and returns the status
// and the raw answer.
func (e *tenantEnv) call(t *testing.T, who, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if tok := e.token[who]; tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	} else if who != "" {
		req.Header.Set("Authorization", "Bearer "+who) // a literal token
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes()
}

// must is call for a step that must answer want.
func (e *tenantEnv) must(t *testing.T, who, method, path, body string, want int) []byte {
	t.Helper()
	code, out := e.call(t, who, method, path, body)
	if code != want {
		t.Fatalf("%s: %s %s %s: %d %s, want %d", who, method, path, body, code, out, want)
	}
	return out
}

// snapshot is every key of the store but the audit trail's.
func snapshot(t *testing.T, s store.Store) map[string]string {
	t.Helper()
	kvs, _, err := s.List(t.Context(), intent.Root)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for k, v := range kvs {
		if !strings.HasPrefix(k, intent.AuditPrefix) {
			out[k] = string(v)
		}
	}
	return out
}

// Every route the controller registers, every route the source registers
// (what openapi_test reads) and every path of the OpenAPI document has an
// authorization scope, and routeScopes names no route that is not served.
func TestEveryRouteHasAScope(t *testing.T) {
	c, _ := newController()
	registered := c.routes().scopes
	for pattern, s := range registered {
		if s == 0 {
			t.Errorf("route %s registered without a scope", pattern)
		}
	}
	for key := range servedRoutes(t) {
		if _, ok := registered[key]; !ok {
			t.Errorf("route %s is in the source but not registered with the router", key)
		}
	}
	doc, _ := readOpenAPI(t)
	for path, ops := range doc.Paths {
		for method := range ops {
			if method == "parameters" {
				continue
			}
			key := strings.ToUpper(method) + " " + path
			if _, err := scopeOf(key); err != nil {
				t.Errorf("api/openapi.yaml: %v", err)
			}
		}
	}
	for pattern := range routeScopes {
		if _, ok := registered[pattern]; !ok {
			t.Errorf("routeScopes has %s, which no handler registers", pattern)
		}
	}
	// A route without a scope is refused where it is registered.
	rt := &router{c: c, mux: http.NewServeMux(), scopes: map[string]scope{}}
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(r.(error).Error(), "routeScopes") {
				t.Errorf("registering a route with no scope: %v, want a panic naming routeScopes", r)
			}
		}()
		rt.HandleFunc("DELETE /v1/widgets/{widget}", func(http.ResponseWriter, *http.Request) {})
	}()
	if s, err := scopeOf("DELETE /v1/farms/{farm}/widgets/{widget}"); err != nil || s != scopeFarm {
		t.Errorf("a route with {farm}: %v %v, want scopeFarm", s, err)
	}
}

// pathFor fills a route pattern's parameters with names of farm blue's
// objects (the other ones the route needs: blue's peer red, host h1).
func pathFor(pattern string) (method, path string) {
	method, path, _ = strings.Cut(pattern, " ")
	vals := map[string]string{"farm": "blue", "subnet": "web", "vm": "web1", "with": "red", "host": "h1",
		"sliver": "s1", "name": "bluetap", "addr": "10.99.0.0", "len": "16", "id": "0000000000000000",
		"proto": "tcp", "port": "80", "address": "192.168.100.50"}
	path = regexp.MustCompile(`\{(\w+)\}`).ReplaceAllStringFunc(path, func(p string) string {
		return vals[strings.Trim(p, "{}")]
	})
	return method, path
}

// A tenant's token is refused, 403 with a message that says so, on every
// write to another farm's objects and on every operator's write; nothing
// changes in the store, and the same writes by blue's own token or the
// admin's are not refused for permission.
func TestTenantIsRefusedEveryWriteOnAnotherFarmOrTheCloud(t *testing.T) {
	e := newTenantEnv(t)
	// A policy of blue's, for the tap routes.
	e.must(t, "blue", "POST", "/v1/taps", `{"name":"bluetap","sender":"blue/web/web1","receiver":"blue/db/db1","monitor":"blue/db/db1"}`, 400)
	e.must(t, "admin", "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"mon1","host":"h1"}`, 201)
	e.must(t, "blue", "POST", "/v1/taps", `{"name":"bluetap","sender":"blue/web/web1","receiver":"blue/db/db1","monitor":"blue/web/mon1"}`, 201)
	bodies := map[string]string{
		"POST /v1/taps":           `{"name":"evil","sender":"blue/web/web1","receiver":"blue/db/db1","monitor":"blue/web/mon1"}`,
		"PUT /v1/taps/{name}":     `{"sender":"red/web/rweb1","receiver":"red/db/rdb1","monitor":"red/web/rweb1"}`,
		"POST /v1/tenants/tokens": `{"farm":"red"}`,
	}
	before := snapshot(t, e.s)
	writes := 0
	for pattern, sc := range e.c.routes().scopes {
		method, path := pathFor(pattern)
		if method == "GET" || sc == scopeAny {
			continue
		}
		writes++
		body := bodies[pattern]
		if body == "" {
			body = "{}"
		}
		code, out := e.call(t, "red", method, path, body)
		if code != 403 || !strings.Contains(string(out), "permission denied") || !strings.Contains(string(out), "tenant red") {
			t.Errorf("red's token: %s %s: %d %s, want 403 saying permission denied to tenant red", method, path, code, out)
		}
	}
	if writes < 20 {
		t.Fatalf("walked %d writes; the router registers more", writes)
	}
	if after := snapshot(t, e.s); !mapsEqual(before, after) {
		t.Errorf("refused writes changed the store")
	}
	// The same credential on its own farm is let through (whatever the
	// handler then says of the body).
	for _, w := range []struct{ method, path, body string }{
		{"POST", "/v1/farms/red/subnets", `{"name":"app"}`},
		{"PUT", "/v1/farms/red/peers/blue", ""},
		{"POST", "/v1/farms/red/subnets/web/vms", `{"name":"rweb2","host":"h2"}`},
	} {
		if code, out := e.call(t, "red", w.method, w.path, w.body); code >= 300 {
			t.Errorf("red on its own farm: %s %s: %d %s", w.method, w.path, code, out)
		}
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// listFarms reads what farms a list's items belong to, per route: a new
// list route of scopeOwnFarm needs its line here.
var listFarms = map[string]func(item map[string]any) []string{
	"GET /v1/farms":   func(m map[string]any) []string { return []string{m["name"].(string)} },
	"GET /v1/subnets": func(m map[string]any) []string { return []string{m["farm"].(string)} },
	"GET /v1/vms":     func(m map[string]any) []string { return []string{m["farm"].(string)} },
	"GET /v1/rules":   func(m map[string]any) []string { return []string{m["farm"].(string)} },
	"GET /v1/audit":   func(m map[string]any) []string { f, _ := m["farm"].(string); return []string{f} },
	"GET /v1/taps": func(m map[string]any) []string {
		mon := m["monitor"].(string)
		return []string{refFarm(m["sender"].(string), mon), refFarm(m["receiver"].(string), mon)}
	},
}

// Every list a tenant may read answers it its own farm's items only, while
// the admin's shows both farms'; cloud-wide lists answer a tenant 403.
func TestTenantListsShowItsOwnFarmOnly(t *testing.T) {
	e := newTenantEnv(t)
	for _, f := range []string{"blue", "red"} {
		e.must(t, f, "POST", "/v1/farms/"+f+"/rules", `{"from":"web","to":"db","proto":"tcp","port":80}`, 201)
		e.must(t, f, "POST", "/v1/taps", `{"name":"`+f+`tap","sender":"`+f+`/web","receiver":"`+f+`/db","monitor":"`+f+`/db/`+map[string]string{"blue": "db1", "red": "rdb1"}[f]+`"}`, 201)
	}
	for pattern, sc := range e.c.routes().scopes {
		method, path := pathFor(pattern)
		if method != "GET" {
			continue
		}
		switch sc {
		case scopeAdmin:
			if code, out := e.call(t, "red", method, path, ""); code != 403 || !strings.Contains(string(out), "permission denied") {
				t.Errorf("red: %s: %d %s, want 403", pattern, code, out)
			}
			continue
		case scopeOwnFarm, scopeTap:
		default:
			continue
		}
		if strings.Contains(pattern, "{") {
			continue // one object, not a list
		}
		if pattern == "GET /v1/observe" {
			continue // a stream, not a list: TestATenantObservesItsOwnFarmOnly
		}
		farmsOf, ok := listFarms[pattern]
		if !ok {
			t.Errorf("list %s: no line in listFarms to check its filtering with", pattern)
			continue
		}
		seen := func(who string) map[string]bool {
			var items []map[string]any
			if err := json.Unmarshal(e.must(t, who, method, path, "", 200), &items); err != nil {
				t.Fatalf("%s: %s: %v", who, pattern, err)
			}
			out := map[string]bool{}
			for _, it := range items {
				for _, f := range farmsOf(it) {
					out[f] = true
				}
			}
			return out
		}
		if got := seen("red"); !got["red"] || len(got) != 1 {
			t.Errorf("red's %s shows farms %v, want red's only", pattern, got)
		}
		if got := seen("admin"); !got["red"] || !got["blue"] {
			t.Errorf("admin's %s shows farms %v, want both", pattern, got)
		}
	}
	// A single object of another farm is a 403, not a 404.
	if code, out := e.call(t, "red", "GET", "/v1/taps/bluetap", ""); code != 403 || !strings.Contains(string(out), "permission denied") {
		t.Errorf("red reads blue's tap: %d %s", code, out)
	}
	e.must(t, "red", "GET", "/v1/taps/redtap", "", 200)
	// Hosts are readable: a tenant places its VMs on them.
	e.must(t, "red", "GET", "/v1/hosts", "", 200)
	if code, _ := e.call(t, "red", "GET", "/v1/audit?farm=blue", ""); code != 403 {
		t.Errorf("red reads blue's audit trail: %d, want 403", code)
	}
}

// Mutual consent takes both identities: blue's token writes blue's half of
// a peering only; the rules of both farms stay ineffective until red's own
// token peers back.
func TestPeeringTakesBothFarmsIdentities(t *testing.T) {
	e := newTenantEnv(t)
	effective := func() bool {
		views, err := e.c.Rules(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, v := range views {
			if v.Effective {
				n++
			}
		}
		return n == 2
	}
	e.must(t, "blue", "POST", "/v1/farms/blue/rules", `{"from":"web","to":"red/web","proto":"tcp","port":80}`, 201)
	e.must(t, "red", "POST", "/v1/farms/red/rules", `{"from":"blue/web","to":"web","proto":"tcp","port":80}`, 201)
	if out := e.must(t, "blue", "PUT", "/v1/farms/blue/peers/red", "", 200); !strings.Contains(string(out), `"mutual":false`) {
		t.Fatalf("blue's half: %s", out)
	}
	// blue cannot say red's half.
	if code, out := e.call(t, "blue", "PUT", "/v1/farms/red/peers/blue", ""); code != 403 || !strings.Contains(string(out), "permission denied") {
		t.Fatalf("blue writes red's half: %d %s, want 403", code, out)
	}
	var red intent.Farm
	if err := store.GetJSON(t.Context(), e.s, intent.FarmsPrefix+"red", &red); err != nil || len(red.Peers) != 0 {
		t.Fatalf("red's peers after blue's attempt: %v %v", red.Peers, err)
	}
	if effective() {
		t.Fatal("one half of a peering made the cross-farm rules effective")
	}
	if out := e.must(t, "red", "PUT", "/v1/farms/red/peers/blue", "", 200); !strings.Contains(string(out), `"mutual":true`) {
		t.Fatalf("red's half: %s", out)
	}
	if !effective() {
		t.Fatal("both halves, by both identities, and both rules: still not effective")
	}
}

// A TAP policy copies only its author's farm's traffic, and a monitor in
// another farm receives copies only with that farm's consent: its own half
// of a peering with the sender's farm, which only its identity can write.
func TestCrossFarmTapNeedsTheMonitorFarmsConsent(t *testing.T) {
	e := newTenantEnv(t)
	cross := `{"name":"x","sender":"blue/web/web1","receiver":"blue/db/db1","monitor":"red/web/rweb1","crossFarm":true}`
	e.must(t, "blue", "PUT", "/v1/farms/blue/peers/red", "", 200)
	if code, out := e.call(t, "blue", "POST", "/v1/taps", cross); code != 400 || !strings.Contains(string(out), "do not peer") {
		t.Fatalf("blue taps into red's VM without red's consent: %d %s, want 400 naming the missing peering", code, out)
	}
	// red's half cannot be written by blue...
	e.must(t, "blue", "PUT", "/v1/farms/red/peers/blue", "", 403)
	// ...and red's credential cannot copy blue's traffic to itself.
	if code, out := e.call(t, "red", "POST", "/v1/taps", cross); code != 403 || !strings.Contains(string(out), "permission denied") {
		t.Fatalf("red taps blue's traffic: %d %s, want 403", code, out)
	}
	e.must(t, "red", "PUT", "/v1/farms/red/peers/blue", "", 200)
	// Peered both ways, red still cannot copy blue's traffic, named by
	// address either.
	if code, out := e.call(t, "red", "POST", "/v1/taps", `{"name":"y","sender":"10.1.1.2","receiver":"any","monitor":"red/web/rweb1","crossFarm":true}`); code != 403 {
		t.Fatalf("red taps blue's VM named by its address: %d %s, want 403", code, out)
	}
	e.must(t, "blue", "POST", "/v1/taps", cross, 201)
	// The monitor's farm sees the policy it consented to, but it is blue's
	// to change or delete.
	e.must(t, "red", "GET", "/v1/taps/x", "", 200)
	e.must(t, "red", "DELETE", "/v1/taps/x", "", 403)
	e.must(t, "blue", "DELETE", "/v1/taps/x", "", 204)
}

// A token is stored as its SHA-256 only, listed without secret, and once
// revoked it is refused (401) on the next request.
func TestTenantTokenIsStoredHashedAndRevokedAtOnce(t *testing.T) {
	e := newTenantEnv(t)
	kvs, _, err := e.s.List(t.Context(), intent.TenantTokensPrefix)
	if err != nil || len(kvs) != 2 {
		t.Fatalf("token keys: %v %v", kvs, err)
	}
	for k, v := range kvs {
		for _, f := range []string{"blue", "red"} {
			if strings.Contains(string(v), e.token[f]) || strings.Contains(string(v), strings.Split(e.token[f], ".")[2]) {
				t.Errorf("%s holds %s's secret: %s", k, f, v)
			}
		}
		var rec tokenRecord
		if err := json.Unmarshal(v, &rec); err != nil || rec.Hash != hashToken(e.token[rec.Farm]) {
			t.Errorf("%s: %s, want the SHA-256 of %s's token", k, v, rec.Farm)
		}
	}
	out := e.must(t, "admin", "GET", "/v1/tenants/tokens", "", 200)
	for _, f := range []string{"blue", "red"} {
		if !strings.Contains(string(out), e.ids[f]) || strings.Contains(string(out), e.token[f]) || strings.Contains(string(out), "sha256") {
			t.Errorf("token list: %s: want %s's id and no secret or hash", out, f)
		}
	}
	if out := e.must(t, "admin", "GET", "/v1/tenants/tokens?farm=red", "", 200); strings.Contains(string(out), e.ids["blue"]) {
		t.Errorf("red's tokens list blue's: %s", out)
	}
	e.must(t, "admin", "POST", "/v1/tenants/tokens", `{"farm":"green"}`, 400)
	e.must(t, "blue", "GET", "/v1/vms", "", 200)
	e.must(t, "blue", "DELETE", "/v1/tenants/tokens/"+e.ids["blue"], "", 403)
	e.must(t, "admin", "DELETE", "/v1/tenants/tokens/"+e.ids["blue"], "", 204)
	if code, out := e.call(t, "blue", "GET", "/v1/vms", ""); code != 401 || !strings.Contains(string(out), "revoked") {
		t.Errorf("revoked token: %d %s, want 401", code, out)
	}
	e.must(t, "admin", "DELETE", "/v1/tenants/tokens/"+e.ids["blue"], "", 404)
	e.must(t, "red", "GET", "/v1/vms", "", 200)
	e.must(t, "oht.0000000000000000.0000", "GET", "/v1/vms", "", 401)
}

// A token revoked through one controller is refused by another on the same
// store as soon as its watch sees the deletion: each checks its own copy,
// which the watch keeps.
func TestTokenRevokedThroughAnotherControllerIsRefused(t *testing.T) {
	e := newTenantEnv(t)
	other := New(e.s, discard)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	rev, err := other.LoadTenantCredentials(ctx)
	if err != nil {
		t.Fatal(err)
	}
	go other.WatchTenantCredentials(ctx, rev)
	srv := httptest.NewServer(other.Authenticate(other.API(), "the-admin-token-0123456789"))
	defer srv.Close()
	get := func(tok string) int {
		req, _ := http.NewRequest("GET", srv.URL+"/v1/farms", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(e.token["red"]); code != 200 {
		t.Fatalf("red's token on the other controller: %d", code)
	}
	fresh, err := e.c.CreateTenantToken(t.Context(), "blue")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the other controller to know the new token", 10*time.Second, func() bool { return get(fresh.Token) == 200 })
	if _, err := e.c.RevokeTenantToken(t.Context(), e.ids["red"]); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the other controller to refuse the revoked token", 10*time.Second, func() bool { return get(e.token["red"]) == 401 })
}

// The audit trail records every accepted write (who, the farm, noun, name,
// the body with secrets redacted), none refused, and a tenant reads its
// own farm's entries only.
func TestAuditRecordsAcceptedWritesWithWhoAndWhat(t *testing.T) {
	e := newTenantEnv(t)
	e.must(t, "blue", "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web9","host":"h1"}`, 201)
	e.must(t, "red", "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web8","host":"h1"}`, 403)
	e.must(t, "red", "POST", "/v1/farms/red/subnets", `{"name":"app"}`, 201)
	e.must(t, "admin", "POST", "/v1/farms", `{"name":"green"}`, 201)
	e.must(t, "admin", "POST", "/v1/tenants/tokens", `{"farm":"green"}`, 201)
	var all []AuditEntry
	if err := json.Unmarshal(e.must(t, "admin", "GET", "/v1/audit", "", 200), &all); err != nil {
		t.Fatal(err)
	}
	if len(all) != 4 {
		t.Fatalf("audit: %d entries, want the 4 accepted writes: %+v", len(all), all)
	}
	vm := all[0]
	if vm.Who != "tenant blue (token "+e.ids["blue"]+")" || vm.Farm != "blue" || vm.Noun != "vms" || vm.Name != "blue/web" ||
		vm.Method != "POST" || vm.Status != 201 || vm.Change != `{"host":"h1","name":"web9"}` || vm.Time.IsZero() {
		t.Errorf("the VM's entry: %+v", vm)
	}
	if all[2].Who != "admin (token)" || all[2].Farm != "green" || all[3].Farm != "green" || all[3].Noun != "tokens" {
		t.Errorf("the admin's entries: %+v %+v", all[2], all[3])
	}
	if !slices.IsSortedFunc(all, func(a, b AuditEntry) int { return strings.Compare(a.ID, b.ID) }) {
		t.Error("entries out of order")
	}
	var reds []AuditEntry
	if err := json.Unmarshal(e.must(t, "red", "GET", "/v1/audit", "", 200), &reds); err != nil || len(reds) != 1 || reds[0].Farm != "red" {
		t.Errorf("red's audit: %+v %v, want its one entry", reds, err)
	}
	// A secret in a body never reaches the trail.
	if got := summarize([]byte(`{"name":"x","token":"s3cr3t","nested":{"sharedKey":"k3y"},"list":[{"password":"pw"}]}`), 80); strings.Contains(got, "s3cr3t") ||
		strings.Contains(got, "k3y") || strings.Contains(got, "pw\"") || !strings.Contains(got, `"name":"x"`) {
		t.Errorf("summary %s", got)
	}
}

// The trail keeps the newest entries only, the oldest dropped in the same
// transaction, and it survives a controller restart: a new controller on
// the same store lists it and goes on trimming it.
func TestAuditIsBoundedAndSurvivesARestart(t *testing.T) {
	e := newTenantEnv(t)
	e.c.SetAuditKeep(3)
	for _, n := range []string{"a1", "a2", "a3", "a4", "a5"} {
		e.must(t, "blue", "POST", "/v1/farms/blue/subnets", `{"name":"`+n+`"}`, 201)
	}
	names := func(c *Controller) []string {
		all, err := c.Audit(t.Context(), "")
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, a := range all {
			out = append(out, a.Change)
		}
		return out
	}
	want := []string{`{"name":"a3"}`, `{"name":"a4"}`, `{"name":"a5"}`}
	if got := names(e.c); !slices.Equal(got, want) {
		t.Fatalf("kept %v, want the newest 3 %v", got, want)
	}
	restarted := New(e.s, discard)
	restarted.SetAuditKeep(3)
	if got := names(restarted); !slices.Equal(got, want) {
		t.Fatalf("after a restart: %v, want %v", got, want)
	}
	srv := httptest.NewServer(restarted.API())
	defer srv.Close()
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"a6"}`, 201)
	if got := names(restarted); !slices.Equal(got, []string{`{"name":"a4"}`, `{"name":"a5"}`, `{"name":"a6"}`}) {
		t.Fatalf("the restarted controller's trail: %v", got)
	}
	if kvs, _, _ := e.s.List(t.Context(), intent.AuditPrefix); len(kvs) != 3 {
		t.Errorf("%d audit keys in the store, want 3", len(kvs))
	}
	// The unix socket (no identity) is an admin's.
	if all, _ := restarted.Audit(t.Context(), "blue"); all[2].Who != "admin (socket)" {
		t.Errorf("a write on the socket is recorded as %q", all[2].Who)
	}
}

// A client certificate with O=onehop-tenant acts as its CN's farm; any
// other certificate the CA signed (the controller's, an agent's) as an
// admin.
func TestTenantCertificateActsOnItsFarmOnly(t *testing.T) {
	e := newTenantEnv(t)
	p := makePKI(t)
	ca, err := pki.LoadCA(p.agent.CA, strings.TrimSuffix(p.agent.CA, ".crt")+".key")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue(pki.TenantRequest("blue"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	blue := pki.Files{CA: p.agent.CA, Cert: dir + "/tenant-blue.crt", Key: dir + "/tenant-blue.key"}
	if err := pair.Write(blue.Cert, blue.Key); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(e.c.Authenticate(e.c.API(), ""))
	if srv.TLS, err = p.controller.ServerConfig(tls.VerifyClientCertIfGiven); err != nil {
		t.Fatal(err)
	}
	srv.StartTLS()
	defer srv.Close()
	do := func(f pki.Files, method, path string) (int, string) {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS(t, f)}, Timeout: 5 * time.Second}
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(`{"name":"app"}`))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	if code, out := do(blue, "POST", "/v1/farms/blue/subnets"); code != 201 {
		t.Fatalf("blue's certificate on blue: %d %s", code, out)
	}
	if code, out := do(blue, "POST", "/v1/farms/red/subnets"); code != 403 || !strings.Contains(out, "permission denied: tenant blue (cert)") {
		t.Fatalf("blue's certificate on red: %d %s", code, out)
	}
	if code, out := do(p.agent, "POST", "/v1/farms/red/subnets"); code != 201 {
		t.Fatalf("an admin's certificate on red: %d %s", code, out)
	}
	all, err := e.c.Audit(t.Context(), "")
	if err != nil || len(all) != 2 || all[0].Who != "tenant blue (cert)" || all[1].Who != "admin (cert h1)" {
		t.Fatalf("audit: %+v %v", all, err)
	}
}

// Deleting a farm revokes its tenant tokens (401 from then on), with or
// without cascade, and the audit entry of the delete names them; a refused
// delete revokes nothing, another farm's tokens stay, and a farm made
// again under the same name admits none of the old ones, not even a token
// its delete did not revoke (one left by a delete before this behaviour).
func TestDeletingAFarmRevokesItsTenantTokensAndANewFarmOfTheNameInheritsNone(t *testing.T) {
	e := newTenantEnv(t)
	var second NewTenantToken
	if err := json.Unmarshal(e.must(t, "admin", "POST", "/v1/tenants/tokens", `{"farm":"blue"}`, 201), &second); err != nil {
		t.Fatal(err)
	}
	e.token["blue2"] = second.Token
	e.must(t, "admin", "DELETE", "/v1/farms/blue", "", 409) // subnets and VMs
	for _, who := range []string{"blue", "blue2"} {
		e.must(t, who, "GET", "/v1/farms/blue", "", 200) // a refused delete revokes nothing
	}

	e.must(t, "admin", "DELETE", "/v1/farms/blue?cascade=true", "", 204)
	for _, who := range []string{"blue", "blue2"} {
		if code, out := e.call(t, who, "GET", "/v1/vms", ""); code != 401 {
			t.Errorf("%s's token after its farm's delete: %d %s, want 401", who, code, out)
		}
	}
	e.must(t, "red", "GET", "/v1/farms/red", "", 200)
	if out := e.must(t, "admin", "GET", "/v1/tenants/tokens", "", 200); strings.Contains(string(out), `"blue"`) || !strings.Contains(string(out), e.ids["red"]) {
		t.Errorf("tokens after blue's delete: %s, want red's only", out)
	}
	for k, v := range snapshot(t, e.s) {
		if strings.HasPrefix(k, intent.TenantTokensPrefix) && strings.Contains(v, `"blue"`) {
			t.Errorf("the store still holds blue's token %s = %s", k, v)
		}
	}
	var all []AuditEntry
	if err := json.Unmarshal(e.must(t, "admin", "GET", "/v1/audit?farm=blue", "", 200), &all); err != nil || len(all) == 0 {
		t.Fatalf("blue's audit: %+v %v", all, err)
	}
	del := all[len(all)-1]
	if del.Method != "DELETE" || del.Noun != "farms" || !strings.Contains(del.Change, "revoked farm blue's tenant tokens: ") ||
		!strings.Contains(del.Change, e.ids["blue"]) || !strings.Contains(del.Change, second.ID) {
		t.Errorf("the delete's audit entry: %+v, want it to name both revoked tokens", del)
	}

	// An empty farm's delete (no cascade) revokes too.
	e.must(t, "admin", "POST", "/v1/farms", `{"name":"green"}`, 201)
	var green NewTenantToken
	if err := json.Unmarshal(e.must(t, "admin", "POST", "/v1/tenants/tokens", `{"farm":"green"}`, 201), &green); err != nil {
		t.Fatal(err)
	}
	e.token["green"] = green.Token
	e.must(t, "green", "GET", "/v1/farms/green", "", 200)
	e.must(t, "admin", "DELETE", "/v1/farms/green", "", 204)
	e.must(t, "green", "GET", "/v1/farms", "", 401)

	// blue again: none of its old tokens is let in.
	e.must(t, "admin", "POST", "/v1/farms", `{"name":"blue"}`, 201)
	for _, who := range []string{"blue", "blue2"} {
		e.must(t, who, "GET", "/v1/farms/blue", "", 401)
	}
	// A token whose farm went without it (removed behind the controller,
	// as a delete before this behaviour did) is revoked by the creation of
	// a farm of that name.
	var stale NewTenantToken
	if err := json.Unmarshal(e.must(t, "admin", "POST", "/v1/tenants/tokens", `{"farm":"blue"}`, 201), &stale); err != nil {
		t.Fatal(err)
	}
	e.token["stale"] = stale.Token
	if err := e.s.Delete(t.Context(), intent.FarmsPrefix+"blue"); err != nil {
		t.Fatal(err)
	}
	e.must(t, "admin", "POST", "/v1/farms", `{"name":"blue"}`, 201)
	e.must(t, "stale", "GET", "/v1/farms/blue", "", 401)
	if err := json.Unmarshal(e.must(t, "admin", "GET", "/v1/audit?farm=blue", "", 200), &all); err != nil {
		t.Fatal(err)
	}
	if c := all[len(all)-1]; c.Method != "POST" || !strings.Contains(c.Change, "revoked farm blue's tenant tokens: "+stale.ID) {
		t.Errorf("the re-creation's audit entry: %+v, want it to name the stale token", c)
	}
}
