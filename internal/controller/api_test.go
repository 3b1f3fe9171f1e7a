package controller

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

func apiServer(t *testing.T) (*httptest.Server, *store.Memory) {
	t.Helper()
	c, s := newController()
	putHost(t, s, "h1")
	srv := httptest.NewServer(c.API())
	t.Cleanup(srv.Close)
	return srv, s
}

// putHost registers a host in the store, as an agent does when it starts.
func putHost(t *testing.T, s *store.Memory, name string) {
	t.Helper()
	if err := store.PutJSON(t.Context(), s, intent.HostsPrefix+name, intent.Host{Name: name}); err != nil {
		t.Fatalf("register host %s: %v", name, err)
	}
}

// call sends one request and returns the status and the JSON object it
// answered with (nil for an empty body or a JSON array). A body that is not
// JSON fails the test: every answer of the API is JSON.
func call(t *testing.T, srv *httptest.Server, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		t.Fatalf("%s %s: read the answer: %v", method, path, err)
	}
	if len(bytes.TrimSpace(buf.Bytes())) == 0 {
		return resp.StatusCode, nil
	}
	var v any
	if err := json.Unmarshal(buf.Bytes(), &v); err != nil {
		t.Fatalf("%s %s: answer %d is not JSON (%v): %q", method, path, resp.StatusCode, err, buf.String())
	}
	out, _ := v.(map[string]any) // a list answers no fields
	return resp.StatusCode, out
}

// mustCall is call for the setup of a test: any other status than want
// fails it there, instead of leaving the test to pass on missing state.
func mustCall(t *testing.T, srv *httptest.Server, method, path, body string, want int) map[string]any {
	t.Helper()
	code, out := call(t, srv, method, path, body)
	if code != want {
		t.Fatalf("setup %s %s %s: status %d, want %d (%v)", method, path, body, code, want, out)
	}
	return out
}

func TestAPICreatesFarmSubnetVMWithAllocatedAddresses(t *testing.T) {
	srv, _ := apiServer(t)
	if code, out := call(t, srv, "POST", "/v1/farms", `{"name":"blue"}`); code != 201 || out["id"].(float64) != 1 {
		t.Fatalf("farm: %d %v", code, out)
	}
	if code, out := call(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`); code != 201 || out["gateway"] != "10.1.1.1" {
		t.Fatalf("subnet: %d %v", code, out)
	}
	code, out := call(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web1","host":"h1"}`)
	if code != 201 || out["ip"] != "10.1.1.2" || out["mac"] != "02:00:0a:01:01:02" {
		t.Fatalf("vm: %d %v", code, out)
	}
}

func TestAPIErrorsSayWhichFieldAndWhy(t *testing.T) {
	srv, _ := apiServer(t)
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"db"}`, 201)
	cases := []struct {
		method, path, body string
		code               int
		field, msg         string
	}{
		{"POST", "/v1/farms", `{"name":"Blue!"}`, 400, "name", "must be lowercase"},
		{"POST", "/v1/farms", `{"name":"blue"}`, 409, "", "already exists"},
		{"POST", "/v1/farms", `{"nmae":"x"}`, 400, "nmae", "unknown field"},
		{"POST", "/v1/farms", `{`, 400, "body", "invalid JSON"},
		{"POST", "/v1/farms/red/subnets", `{"name":"web"}`, 404, "", `farm "red"`},
		{"POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web1","host":"h9"}`, 400, "host", `no host "h9"`},
		{"POST", "/v1/farms/blue/subnets/web/vms", `{"name":"averyverylongname","host":"h1"}`, 400, "name", "at most 11"},
		{"POST", "/v1/farms/blue/rules", `{"from":"web","to":"dbx","proto":"tcp","port":5432}`, 400, "to", `no subnet "blue/dbx"`},
		{"POST", "/v1/farms/blue/rules", `{"from":"web","to":"db","proto":"icmp","port":7}`, 400, "port", "needs proto tcp or udp"},
		{"POST", "/v1/farms/blue/rules", `{"from":"web","to":"db","proto":"sctp"}`, 400, "proto", "not tcp, udp, icmp"},
		{"PUT", "/v1/farms/blue/peers/red", ``, 400, "with", `farm "red"`},
		{"DELETE", "/v1/farms/blue/subnets/web/vms/nope", ``, 404, "", "vm blue/web/nope"},
		{"PUT", "/v1/farms/blue/subnets/web/vms/nope/host", `{"host":"h1"}`, 404, "", "vm blue/web/nope"},
	}
	for _, c := range cases {
		t.Run(c.method+" "+c.path+" "+c.body, func(t *testing.T) {
			code, out := call(t, srv, c.method, c.path, c.body)
			if code != c.code {
				t.Fatalf("status %d, want %d (%v)", code, c.code, out)
			}
			if c.field != "" && out["field"] != c.field {
				t.Errorf("field %v, want %s", out["field"], c.field)
			}
			if msg, _ := out["error"].(string); !strings.Contains(msg, c.msg) {
				t.Errorf("error %q, want it to contain %q", msg, c.msg)
			}
		})
	}
}

func TestAPIInterFarmRuleIsEffectiveOnlyOnceBothPeerAndAllow(t *testing.T) {
	srv, _ := apiServer(t)
	for _, f := range []string{"blue", "red"} {
		mustCall(t, srv, "POST", "/v1/farms", `{"name":"`+f+`"}`, 201)
		mustCall(t, srv, "POST", "/v1/farms/"+f+"/subnets", `{"name":"web"}`, 201)
	}
	effective := func() bool {
		resp, err := http.Get(srv.URL + "/v1/rules")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var views []RuleView
		if err := json.NewDecoder(resp.Body).Decode(&views); err != nil {
			t.Fatalf("GET /v1/rules: %v", err)
		}
		for _, v := range views {
			if v.Farm == "blue" {
				return v.Effective
			}
		}
		t.Fatal("blue's rule not listed")
		return false
	}
	mustCall(t, srv, "POST", "/v1/farms/blue/rules", `{"from":"web","to":"red/web","proto":"tcp","port":80}`, 201)
	if _, out := call(t, srv, "PUT", "/v1/farms/blue/peers/red", ""); out["mutual"] != false || effective() {
		t.Fatalf("effective before red agreed (%v)", out)
	}
	mustCall(t, srv, "POST", "/v1/farms/red/rules", `{"from":"blue/web","to":"web","proto":"tcp","port":80}`, 201)
	if _, out := call(t, srv, "PUT", "/v1/farms/red/peers/blue", ""); out["mutual"] != true || !effective() {
		t.Fatalf("not effective after both peered and allowed (%v)", out)
	}
}

func TestAPIFirewallRuleIsValidatedAndStored(t *testing.T) {
	srv, s := apiServer(t)
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web1","host":"h1"}`, 201)
	path := "/v1/farms/blue/subnets/web/vms/web1/firewall"
	if code, out := call(t, srv, "POST", path, `{"rule":{"dir":"in","proto":"tcp","portLo":22,"portHi":22,"cidr":"10.1.2.7/24","action":"deny"}}`); code != 200 {
		t.Fatalf("%d %v", code, out)
	}
	if code, out := call(t, srv, "POST", path, `{"rule":{"dir":"up","action":"deny"}}`); code != 400 || out["field"] != "rule.dir" {
		t.Fatalf("bad dir accepted: %d %v", code, out)
	}
	var v intent.VM
	if err := store.GetJSON(t.Context(), s, intent.VMsPrefix+"blue/web/web1", &v); err != nil {
		t.Fatal(err)
	}
	if v.Firewall == nil || len(v.Firewall.Rules) != 1 || v.Firewall.Rules[0].CIDR != "10.1.2.0/24" {
		t.Fatalf("stored firewall %+v", v.Firewall)
	}
}

func TestAPIMoveKeepsTheVMsAddress(t *testing.T) {
	srv, s := apiServer(t)
	putHost(t, s, "h2")
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web1","host":"h1"}`, 201)
	if code, out := call(t, srv, "PUT", "/v1/farms/blue/subnets/web/vms/web1/host", `{"host":"h9"}`); code != 400 || out["field"] != "host" {
		t.Fatalf("move to an unknown host: %d %v", code, out)
	}
	code, out := call(t, srv, "PUT", "/v1/farms/blue/subnets/web/vms/web1/host", `{"host":"h2"}`)
	if code != 200 || out["host"] != "h2" || out["ip"] != "10.1.1.2" {
		t.Fatalf("move: %d %v", code, out)
	}
}
