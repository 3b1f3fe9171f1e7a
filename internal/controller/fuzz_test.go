package controller

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/policy"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// The fuzz targets below send what a client can send to each handler that
// reads input (its body, or for peer its path) and hold the API to three
// promises: it never panics, never answers 5xx (the memory store does not
// fail), and every error is JSON naming a field. Their seeds are the bodies
// of the table tests.

const fuzzTopo = `name: fuzz
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}]
    rules: [{from: web, to: db, proto: tcp, port: 5432}]
  - name: red
    subnets: [{name: web}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
  - {name: db1, host: h2, subnet: blue/db}
`

// fuzzAPI returns a function that sends one request to a fresh controller
// holding fuzzTopo and checks the answer; it returns the controller's store
// and the status for further checks.
func fuzzAPI(f *testing.F) func(t *testing.T, method, path, body string) (*store.Memory, int) {
	return fuzzAPIOn(f, fuzzTopo)
}

// fuzzAPIOn is fuzzAPI on a topology of the target's own.
func fuzzAPIOn(f *testing.F, topoYAML string) func(t *testing.T, method, path, body string) (*store.Memory, int) {
	return fuzzAPIWith(f, topoYAML, nil)
}

// fuzzAPIWith is fuzzAPIOn with setup run on the controller before each
// request (nil: none): state no topology holds.
func fuzzAPIWith(f *testing.F, topoYAML string, setup func(t *testing.T, c *Controller, s *store.Memory)) func(t *testing.T, method, path, body string) (*store.Memory, int) {
	topo, err := topology.Parse("fuzz.yaml", []byte(topoYAML))
	if err != nil {
		f.Fatal(err)
	}
	return func(t *testing.T, method, path, body string) (*store.Memory, int) {
		c, s := newController()
		if err := c.ApplyTopology(t.Context(), topo); err != nil {
			t.Fatal(err)
		}
		if setup != nil {
			setup(t, c, s)
		}
		req := httptest.NewRequest(method, "http://onehop"+path, strings.NewReader(body))
		rec := httptest.NewRecorder()
		c.API().ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %s %q: %d %s", method, path, body, rec.Code, rec.Body)
		}
		if rec.Code >= 400 {
			var e struct {
				Field string `json:"field"`
				Error string `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Field == "" || e.Error == "" {
				t.Fatalf("%s %s %q: %d %q names no field (%v)", method, path, body, rec.Code, rec.Body, err)
			}
		}
		return s, rec.Code
	}
}

func seedBodies(f *testing.F, bodies ...string) {
	for _, b := range bodies {
		f.Add(b)
	}
}

func FuzzAPIFarmBody(f *testing.F) {
	seedBodies(f, `{"name":"green"}`, `{"name":"green","proxyARP":true}`, `{"name":"Blue!"}`, `{"name":"blue"}`,
		`{"nmae":"x"}`, `{`, `{"name":"green"} x`, ``, `[]`, `{"name":7}`, `null`)
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, body string) { send(t, "POST", "/v1/farms", body) })
}

func FuzzAPISubnetBody(f *testing.F) {
	seedBodies(f, `{"name":"app"}`, `{"name":"web"}`, `{"name":""}`, `{"name":"A"}`, `{"name":"app"}{}`, `{"name":null}`)
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, body string) { send(t, "POST", "/v1/farms/blue/subnets", body) })
}

func FuzzAPIVMBody(f *testing.F) {
	seedBodies(f, `{"name":"web3","host":"h1"}`, `{"name":"web1","host":"h9"}`, `{"name":"averyverylongname","host":"h1"}`,
		`{"name":"h1","host":"h1"}`, `{"name":"fabric","host":"h2"}`, `{"name":"web1","host":"h1"}`, `{"host":"h1"}`)
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, body string) { send(t, "POST", "/v1/farms/blue/subnets/web/vms", body) })
}

func FuzzAPIHostBody(f *testing.F) {
	seedBodies(f, `{"name":"h4"}`, `{"name":"h4","address":"192.168.100.44"}`, `{"name":"h1"}`, `{"name":"H4"}`,
		`{"name":"fabric"}`, `{"name":"h5","address":"x"}`, `{"name":"web1"}`, `{"name":"h4","adress":"1.2.3.4"}`)
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, body string) { send(t, "POST", "/v1/hosts", body) })
}

func FuzzAPIMoveBody(f *testing.F) {
	seedBodies(f, `{"host":"h2"}`, `{"host":"h1"}`, `{"host":"h9"}`, `{"host":""}`, `{"host":["h1"]}`, `{"to":"h2"}`)
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, body string) { send(t, "PUT", "/v1/farms/blue/subnets/web/vms/web1/host", body) })
}

// A rule that is accepted is stored in its normalized form.
func FuzzAPIRuleBody(f *testing.F) {
	seedBodies(f, `{"from":"web","to":"db","proto":"tcp","port":5432}`, `{"from":"web","to":"db","proto":"TCP","port":5432}`,
		`{"from":"web","to":"dbx","proto":"tcp","port":5432}`, `{"from":"web","to":"db","proto":"icmp","port":7}`,
		`{"from":"web","to":"db","proto":"sctp"}`, `{"from":"web","to":"red/web","proto":"any"}`, `{"from":"web","to":"web"}`,
		`{"from":"red/web","to":"db","port":-1}`, `{"from":"web","to":"db","port":65536}`)
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, body string) {
		s, code := send(t, "POST", "/v1/farms/blue/rules", body)
		if code != http.StatusCreated {
			return
		}
		var farm intent.Farm
		if err := store.GetJSON(t.Context(), s, intent.FarmsPrefix+"blue", &farm); err != nil {
			t.Fatal(err)
		}
		for _, r := range farm.Rules {
			if n, err := policy.NormalizeRule(r); err != nil || n != r {
				t.Fatalf("%q stored rule %+v, not in its normal form %+v (%v)", body, r, n, err)
			}
		}
	})
}

// A firewall that is accepted is valid for the datapath and stored in its
// normalized form: the same check the agent runs (policy.CheckFirewall).
func FuzzAPIFirewallBody(f *testing.F) {
	seedBodies(f, `{"rule":{"dir":"in","proto":"tcp","portLo":22,"portHi":22,"cidr":"10.1.2.7/24","action":"deny"}}`,
		`{"rule":{"dir":"up","action":"deny"}}`, `{"defaultIn":"deny"}`, `{"defaultOut":"DENY","rule":{"dir":"OUT","action":"Allow"}}`,
		`{"rule":{"dir":"in","proto":"tcp","portHi":80,"action":"deny"}}`, `{"rule":{"dir":"in","proto":"tcp","portLo":90,"portHi":80,"action":"deny"}}`,
		`{"rule":{"dir":"in","proto":"icmp","portLo":80,"action":"deny"}}`, `{"rule":{"dir":"in","cidr":"::/0","action":"deny"}}`,
		`{"rule":null}`, `{}`, `{"rule":{"dir":"in","action":"deny","portLo":70000}}`)
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, body string) {
		s, code := send(t, "POST", "/v1/farms/blue/subnets/web/vms/web1/firewall", body)
		if code != http.StatusOK {
			return
		}
		var v intent.VM
		if err := store.GetJSON(t.Context(), s, intent.VMsPrefix+"blue/web/web1", &v); err != nil {
			t.Fatal(err)
		}
		if err := policy.CheckFirewall(v.Firewall); err != nil {
			t.Fatalf("%q stored a firewall the agent rejects: %v", body, err)
		}
		for _, r := range v.Firewall.Rules {
			if n, err := policy.NormalizeFirewallRule(r); err != nil || n != r {
				t.Fatalf("%q stored rule %+v, not in its normal form %+v (%v)", body, r, n, err)
			}
		}
	})
}

// Peer takes no body: what a client chooses is the two farm names in the path.
func FuzzAPIPeerPath(f *testing.F) {
	for _, p := range [][2]string{{"blue", "red"}, {"red", "blue"}, {"blue", "blue"}, {"blue", "green"}, {"green", "blue"}, {"a/b", ".."}, {"", "red"}} {
		f.Add(p[0], p[1])
	}
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, farm, with string) {
		send(t, "PUT", "/v1/farms/"+url.PathEscape(farm)+"/peers/"+url.PathEscape(with), "")
	})
}

// A tenant token's body: only an existing farm gets a token, and the token
// is answered once, never stored.
func FuzzAPITenantTokenBody(f *testing.F) {
	seedBodies(f, `{"farm":"blue"}`, `{"farm":"green"}`, `{"farm":""}`, `{}`, `{"farm":["blue"]}`, `{"farm":"blue","id":"x"}`, `{"farm":"blue"}{}`)
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, body string) {
		s, code := send(t, "POST", "/v1/tenants/tokens", body)
		kvs, _, err := s.List(t.Context(), intent.TenantTokensPrefix)
		if err != nil {
			t.Fatal(err)
		}
		if (code == http.StatusCreated) != (len(kvs) == 1) {
			t.Fatalf("%q: %d with %d token keys", body, code, len(kvs))
		}
		for k, v := range kvs {
			var rec tokenRecord
			if err := json.Unmarshal(v, &rec); err != nil || rec.Farm != "blue" && rec.Farm != "red" || len(rec.Hash) != 64 || strings.Contains(string(v), "oht.") {
				t.Fatalf("%q: stored %s = %s", body, k, v)
			}
		}
	})
}

// Whatever a write's body holds, its audit summary is short and holds no
// value of a field named like a secret.
func FuzzAuditSummaryHoldsNoSecret(f *testing.F) {
	seedBodies(f, `{"name":"x","token":"s3cr3tvalue"}`, `{"a":{"Secret":"s3cr3tvalue"}}`, `[{"password":"s3cr3tvalue"}]`, `{"siteKey":["s3cr3tvalue"]}`, `not json s3cr3tvalue`, ``)
	f.Fuzz(func(t *testing.T, body string) {
		got := summarize([]byte(body), len(body))
		if len(got) > auditChangeMax {
			t.Fatalf("%q: summary of %d bytes", body, len(got))
		}
		var v any
		if json.Unmarshal([]byte(body), &v) != nil {
			if got != "" && !strings.HasPrefix(got, "(") {
				t.Fatalf("%q is not JSON, yet summarized as %q", body, got)
			}
			return
		}
		var secrets []string
		var walk func(any, bool)
		walk = func(v any, secret bool) {
			switch x := v.(type) {
			case map[string]any:
				for k, e := range x {
					walk(e, secret || secretField(k))
				}
			case []any:
				for _, e := range x {
					walk(e, secret)
				}
			case string:
				if secret && len(x) >= 6 {
					secrets = append(secrets, x)
				}
			}
		}
		walk(v, false)
		for _, s := range secrets {
			if strings.Contains(got, s) {
				t.Fatalf("%q: summary %q holds the secret %q", body, got, s)
			}
		}
	})
}

// Whatever request red's tenant token sends, nothing of farm blue's and
// nothing cloud-wide changes: its records, its VMs' desired state, its
// farm state, the hosts, slivers, LISP mappings and tokens.
func FuzzTenantChangesNothingOfAnotherFarm(f *testing.F) {
	for _, s := range []struct {
		m          uint8
		path, body string
	}{
		{1, "/v1/farms/blue/subnets", `{"name":"app"}`},
		{1, "/v1/farms/red/subnets", `{"name":"app"}`},
		{2, "/v1/farms/blue/peers/red", ``},
		{2, "/v1/farms/red/peers/blue", ``},
		{3, "/v1/farms/blue/subnets/web/vms/web1", ``},
		{1, "/v1/farms/red/rules", `{"from":"blue/web","to":"web"}`},
		{1, "/v1/taps", `{"name":"t","sender":"10.1.1.2","receiver":"any","monitor":"red/web/rweb1","crossFarm":true}`},
		{1, "/v1/farms/red/subnets/web/vms", `{"name":"web1","host":"h1"}`},
		{2, "/v1/farms/red/subnets/web/vms/rweb1/host", `{"host":"h2","subnet":"blue/web"}`},
		{1, "/v1/hosts", `{"name":"h9"}`},
		{1, "/v1/tenants/tokens", `{"farm":"blue"}`},
		{1, "/v1/farms/red%2Fx/subnets", `{"name":"a"}`},
		{1, "/v1/farms/blue/../red/subnets", `{"name":"a"}`},
	} {
		f.Add(s.m, s.path, s.body)
	}
	topo, err := topology.Parse("tenants.yaml", []byte(tenantTopo))
	if err != nil {
		f.Fatal(err)
	}
	methods := []string{"GET", "POST", "PUT", "DELETE", "PATCH"}
	f.Fuzz(func(t *testing.T, m uint8, path, body string) {
		req, err := http.NewRequest(methods[int(m)%len(methods)], "http://onehop"+path, strings.NewReader(body))
		if err != nil || !strings.HasPrefix(path, "/") {
			return
		}
		c, s := newController()
		if err := c.ApplyTopology(t.Context(), topo); err != nil {
			t.Fatal(err)
		}
		red, err := c.CreateTenantToken(t.Context(), "red")
		if err != nil {
			t.Fatal(err)
		}
		protected := func() map[string]string {
			kvs, _, err := s.List(t.Context(), intent.Root)
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]string{}
			for k, v := range kvs {
				for _, p := range []string{intent.FarmsPrefix + "blue", intent.SubnetsPrefix + "blue/", intent.VMsPrefix + "blue/",
					intent.VMIDsPrefix + "blue/", intent.HostsPrefix, intent.SliversPrefix, intent.LISPMappingsPrefix,
					intent.TenantTokensPrefix, intent.FarmStateKey(1)} {
					if strings.HasPrefix(k, p) || strings.Contains(k, "/vm/blue/") {
						out[k] = string(v)
					}
				}
			}
			return out
		}
		before := protected()
		req.Header.Set("Authorization", "Bearer "+red.Token)
		rec := httptest.NewRecorder()
		c.Authenticate(c.API(), "").ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %s %q: %d %s", req.Method, path, body, rec.Code, rec.Body)
		}
		if after := protected(); !mapsEqual(before, after) {
			t.Fatalf("red's %s %s %q (%d %s) changed blue's or the cloud's keys", req.Method, path, body, rec.Code, rec.Body)
		}
	})
}
