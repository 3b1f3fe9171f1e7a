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
	store.PutJSON(t.Context(), s, intent.HostsPrefix+"h1", intent.Host{Name: "h1"})
	srv := httptest.NewServer(c.API())
	t.Cleanup(srv.Close)
	return srv, s
}

func call(t *testing.T, srv *httptest.Server, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	json.Unmarshal(buf.Bytes(), &out)
	return resp.StatusCode, out
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
	call(t, srv, "POST", "/v1/farms", `{"name":"blue"}`)
	call(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`)
	call(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"db"}`)
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
		call(t, srv, "POST", "/v1/farms", `{"name":"`+f+`"}`)
		call(t, srv, "POST", "/v1/farms/"+f+"/subnets", `{"name":"web"}`)
	}
	effective := func() bool {
		req, _ := http.NewRequest("GET", srv.URL+"/v1/rules", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var views []RuleView
		json.NewDecoder(resp.Body).Decode(&views)
		for _, v := range views {
			if v.Farm == "blue" {
				return v.Effective
			}
		}
		t.Fatal("blue's rule not listed")
		return false
	}
	call(t, srv, "POST", "/v1/farms/blue/rules", `{"from":"web","to":"red/web","proto":"tcp","port":80}`)
	if _, out := call(t, srv, "PUT", "/v1/farms/blue/peers/red", ""); out["mutual"] != false || effective() {
		t.Fatalf("effective before red agreed (%v)", out)
	}
	call(t, srv, "POST", "/v1/farms/red/rules", `{"from":"blue/web","to":"web","proto":"tcp","port":80}`)
	if _, out := call(t, srv, "PUT", "/v1/farms/red/peers/blue", ""); out["mutual"] != true || !effective() {
		t.Fatalf("not effective after both peered and allowed (%v)", out)
	}
}

func TestAPIFirewallRuleIsValidatedAndStored(t *testing.T) {
	srv, s := apiServer(t)
	call(t, srv, "POST", "/v1/farms", `{"name":"blue"}`)
	call(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`)
	call(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web1","host":"h1"}`)
	path := "/v1/farms/blue/subnets/web/vms/web1/firewall"
	if code, out := call(t, srv, "POST", path, `{"rule":{"dir":"in","proto":"tcp","portLo":22,"portHi":22,"cidr":"10.1.2.7/24","action":"deny"}}`); code != 200 {
		t.Fatalf("%d %v", code, out)
	}
	if code, out := call(t, srv, "POST", path, `{"rule":{"dir":"up","action":"deny"}}`); code != 400 || out["field"] != "rule.dir" {
		t.Fatalf("bad dir accepted: %d %v", code, out)
	}
	var v intent.VM
	store.GetJSON(t.Context(), s, intent.VMsPrefix+"blue/web/web1", &v)
	if v.Firewall == nil || len(v.Firewall.Rules) != 1 || v.Firewall.Rules[0].CIDR != "10.1.2.0/24" {
		t.Fatalf("stored firewall %+v", v.Firewall)
	}
}

func TestAPIMoveKeepsTheVMsAddress(t *testing.T) {
	srv, s := apiServer(t)
	store.PutJSON(t.Context(), s, intent.HostsPrefix+"h2", intent.Host{Name: "h2"})
	call(t, srv, "POST", "/v1/farms", `{"name":"blue"}`)
	call(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`)
	call(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web1","host":"h1"}`)
	if code, out := call(t, srv, "PUT", "/v1/farms/blue/subnets/web/vms/web1/host", `{"host":"h9"}`); code != 400 || out["field"] != "host" {
		t.Fatalf("move to an unknown host: %d %v", code, out)
	}
	code, out := call(t, srv, "PUT", "/v1/farms/blue/subnets/web/vms/web1/host", `{"host":"h2"}`)
	if code != 200 || out["host"] != "h2" || out["ip"] != "10.1.1.2" {
		t.Fatalf("move: %d %v", code, out)
	}
}
