package controller

import (
	"encoding/json"
	"io"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// twoFarms serves a controller holding blue (web, db: web1 on h1, db1 on
// h2, a rule web -> db) and red (web: r1 on h1), which peer both ways;
// red allows its web to blue's db, and tap mon copies web1's traffic to
// db1.
func twoFarms(t *testing.T) (*httptest.Server, *store.Memory) {
	t.Helper()
	srv, s := apiServer(t)
	putHost(t, s, "h2")
	for _, f := range []string{"blue", "red"} {
		mustCall(t, srv, "POST", "/v1/farms", `{"name":"`+f+`","proxyARP":true}`, 201)
	}
	for _, fs := range [][2]string{{"blue", "web"}, {"blue", "db"}, {"red", "web"}} {
		mustCall(t, srv, "POST", "/v1/farms/"+fs[0]+"/subnets", `{"name":"`+fs[1]+`"}`, 201)
	}
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web1","host":"h1"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/db/vms", `{"name":"db1","host":"h2"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/red/subnets/web/vms", `{"name":"r1","host":"h1"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/rules", `{"from":"web","to":"db","proto":"tcp","port":5432}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/red/rules", `{"from":"web","to":"blue/db","proto":"tcp","port":5432}`, 201)
	mustCall(t, srv, "PUT", "/v1/farms/blue/peers/red", ``, 200)
	mustCall(t, srv, "PUT", "/v1/farms/red/peers/blue", ``, 200)
	mustCall(t, srv, "POST", "/v1/taps", `{"name":"mon","sender":"blue/web/web1","receiver":"any","monitor":"blue/db/db1"}`, 201)
	return srv, s
}

// keysNaming lists every key of the store (intent, desired state, farm
// states) whose name or value mentions any of words.
func keysNaming(t *testing.T, s *store.Memory, words ...string) []string {
	t.Helper()
	kvs, _, err := s.List(t.Context(), intent.Root)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for k, v := range kvs {
		if strings.HasPrefix(k, intent.AuditPrefix) {
			continue // the audit trail is history: it names what was deleted
		}
		if strings.HasPrefix(k, intent.TenantCertRevocationsPrefix+"farm/") {
			continue // the old tenant's certificates stay revoked (api_certs.go)
		}
		for _, w := range words {
			if strings.Contains(k, w) || strings.Contains(string(v), w) {
				out = append(out, k+" = "+string(v))
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// dependantsOf409 checks a 409 of a delete and returns its dependants.
func dependantsOf409(t *testing.T, code int, out map[string]any, field string) []string {
	t.Helper()
	if code != 409 || out["field"] != field {
		t.Fatalf("delete with dependants: %d %v, want 409 naming %s", code, out, field)
	}
	var deps []string
	for _, d := range out["dependants"].([]any) {
		deps = append(deps, d.(string))
		if !strings.Contains(out["error"].(string), d.(string)) {
			t.Errorf("the message %q does not name dependant %q", out["error"], d)
		}
	}
	return deps
}

func TestAPIFarmDeleteIsRefusedNamingItsDependantsAndCascadeLeavesNothing(t *testing.T) {
	srv, s := twoFarms(t)
	out := mustCall(t, srv, "GET", "/v1/farms/blue", "", 200)
	if out["name"] != "blue" || out["id"] != 1.0 || len(out["rules"].([]any)) != 1 {
		t.Fatalf("GET farm blue: %v", out)
	}
	code, out := call(t, srv, "DELETE", "/v1/farms/blue", "")
	got := dependantsOf409(t, code, out, "farm")
	want := []string{"subnet blue/db", "subnet blue/web", "vm blue/db/db1", "vm blue/web/web1",
		"rule of farm red: red/web -> blue/db tcp/5432", "peering of farm red", "tap mon"}
	if !slices.Equal(got, want) {
		t.Fatalf("dependants %q, want %q", got, want)
	}
	if !strings.Contains(out["error"].(string), "cascade=true (CLI --cascade)") {
		t.Errorf("the 409 does not say how to cascade: %v", out["error"])
	}
	if len(keysNaming(t, s, "blue")) == 0 {
		t.Fatal("a refused delete removed the farm")
	}
	if code, out := call(t, srv, "DELETE", "/v1/farms/blue?cascade=yes", ""); code != 400 || out["field"] != "cascade" {
		t.Errorf("cascade=yes: %d %v, want 400 naming cascade", code, out)
	}

	mustCall(t, srv, "DELETE", "/v1/farms/blue?cascade=true", "", 204)
	// Nothing names blue, its VMs or their addresses; no farm state of id 1.
	if left := keysNaming(t, s, "blue", "web1", "db1", "10.1."); len(left) > 0 {
		t.Errorf("keys left after the cascade:\n%s", strings.Join(left, "\n"))
	}
	if _, err := s.Get(t.Context(), intent.FarmStateKey(1)); err == nil {
		t.Error("blue's farm state is still in the store")
	}
	// red lost its rule and peering naming blue, and nothing else.
	red := mustCall(t, srv, "GET", "/v1/farms/red", "", 200)
	if red["rules"] != nil || red["peers"] != nil || red["id"] != 2.0 {
		t.Errorf("red after blue's cascade: %v, want its rule and peering naming blue gone", red)
	}
	if _, err := s.Get(t.Context(), intent.DesiredVMKey("h1", "red/web/r1")); err != nil {
		t.Errorf("red's VM lost its desired key: %v", err)
	}
	mustCall(t, srv, "GET", "/v1/farms/blue", "", 404)
	mustCall(t, srv, "GET", "/v1/taps/mon", "", 404)

	// The ids are free again: a new farm takes blue's id 1, its first
	// subnet id 1 and its first VM 10.1.1.2.
	if out := mustCall(t, srv, "POST", "/v1/farms", `{"name":"green"}`, 201); out["id"] != 1.0 {
		t.Errorf("green got id %v, want blue's freed 1", out["id"])
	}
	if out := mustCall(t, srv, "POST", "/v1/farms/green/subnets", `{"name":"app"}`, 201); out["prefix"] != "10.1.1.0/24" {
		t.Errorf("green/app got %v, want 10.1.1.0/24", out["prefix"])
	}
	if out := mustCall(t, srv, "POST", "/v1/farms/green/subnets/app/vms", `{"name":"app1","host":"h2"}`, 201); out["ip"] != "10.1.1.2" {
		t.Errorf("app1 got %v, want web1's freed 10.1.1.2", out["ip"])
	}
	// A farm that has nothing goes without a cascade.
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"empty"}`, 201)
	mustCall(t, srv, "DELETE", "/v1/farms/empty", "", 204)
	if left := keysNaming(t, s, "empty"); len(left) > 0 {
		t.Errorf("keys of an empty farm left: %v", left)
	}
}

func TestAPIFarmGetListAndDeleteErrorsNameTheField(t *testing.T) {
	srv, _ := twoFarms(t)
	cases := []struct {
		method, path string
		code         int
		field, msg   string
	}{
		{"GET", "/v1/farms/nope", 404, "farm", `farm "nope": not found`},
		{"GET", "/v1/farms/Blue!", 400, "farm", `farm name "Blue!" must be lowercase`},
		{"DELETE", "/v1/farms/nope", 404, "farm", `farm "nope": not found`},
		{"DELETE", "/v1/farms/Blue!", 400, "farm", "must be lowercase"},
		{"DELETE", "/v1/farms/red?cascade=1", 400, "cascade", `cascade="1": want true or false`},
		{"GET", "/v1/farms/nope/subnets", 404, "farm", `farm "nope"`},
		{"GET", "/v1/farms/nope/vms", 404, "farm", `farm "nope"`},
	}
	for _, c := range cases {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			code, out := call(t, srv, c.method, c.path, "")
			if code != c.code || out["field"] != c.field || !strings.Contains(out["error"].(string), c.msg) {
				t.Fatalf("%d %v, want %d naming %s: %q", code, out, c.code, c.field, c.msg)
			}
		})
	}
	// red: r1, and blue's rules and TAP policy that name blue's db only.
	code, out := call(t, srv, "DELETE", "/v1/farms/red", "")
	got := dependantsOf409(t, code, out, "farm")
	if want := []string{"subnet red/web", "vm red/web/r1", "peering of farm blue"}; !slices.Equal(got, want) {
		t.Errorf("red's dependants %q, want %q", got, want)
	}
	var farms []intent.Farm
	if err := json.Unmarshal(get(t, srv, "/v1/farms"), &farms); err != nil || len(farms) != 2 {
		t.Fatalf("GET /v1/farms: %v %v", farms, err)
	}
}

// get answers path's body (200 or the test fails).
func get(t *testing.T, srv *httptest.Server, path string) []byte {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return b
}
