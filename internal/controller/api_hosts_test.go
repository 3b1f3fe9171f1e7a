package controller

import (
	"slices"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// hostKeys lists every key of the store that belongs to host: under a
// prefix of its own or naming it as the last segment of a per-host record.
func hostKeys(t *testing.T, s store.Store, host string) []string {
	t.Helper()
	kvs, _, err := s.List(t.Context(), intent.Root)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for k, v := range kvs {
		if strings.HasPrefix(k, intent.AuditPrefix) {
			continue // the audit trail records the removal: history, not a key of the host
		}
		if strings.Contains(k, "/"+host+"/") || strings.HasSuffix(k, "/"+host) || strings.Contains(string(v), `"`+host+`"`) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func TestAPIAddsHostsWithCheckedNames(t *testing.T) {
	srv, s := apiServer(t)
	out := mustCall(t, srv, "POST", "/v1/hosts", `{"name":"h4","address":"192.168.100.40"}`, 201)
	if out["name"] != "h4" || out["address"] != "192.168.100.40" {
		t.Fatalf("added host: %v", out)
	}
	mustCall(t, srv, "POST", "/v1/hosts", `{"name":"h5"}`, 201) // the address is the agent's to report
	var h intent.Host
	if err := store.GetJSON(t.Context(), s, intent.HostsPrefix+"h4", &h); err != nil || h.Address != "192.168.100.40" {
		t.Fatalf("host record: %+v %v", h, err)
	}
	// A VM may be placed on it at once.
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web4","host":"h4"}`, 201)
	if _, err := s.Get(t.Context(), intent.DesiredVMKey("h4", "blue/web/web4")); err != nil {
		t.Fatalf("the VM on the added host has no desired key: %v", err)
	}
	for _, c := range []struct {
		body        string
		code        int
		field, says string
	}{
		{`{"name":"H4"}`, 400, "name", "lowercase"},
		{`{"name":""}`, 400, "name", "lowercase"},
		{`{"name":"averyveryverylongname"}`, 400, "name", "1-12"},
		{`{"name":"fabric"}`, 400, "name", "reserved"},
		{`{"name":"h6","address":"fe80::1"}`, 400, "address", "not an IPv4"},
		{`{"name":"h6","address":"nope"}`, 400, "address", "not an IPv4"},
		{`{"name":"h6","uplink":"eth0"}`, 400, "uplink", "unknown field"},
		{`{"name":"h4"}`, 409, "name", "host h4: already exists"},
		{`{"name":"h1"}`, 409, "name", "already exists"},
		{`{"name":"h6","address":"192.168.100.40"}`, 409, "address", "host h4's"},
		{`{"name":"web4"}`, 409, "name", "vm blue/web/web4"},
	} {
		code, out := call(t, srv, "POST", "/v1/hosts", c.body)
		if code != c.code || out["field"] != c.field || !strings.Contains(out["error"].(string), c.says) {
			t.Errorf("POST /v1/hosts %s: %d %v, want %d naming %s with %q", c.body, code, out, c.code, c.field, c.says)
		}
	}
}

func TestAPIRemovesHostOnlyWhenEmptyOrDrainedAndLeavesNoKeyOfIt(t *testing.T) {
	srv, s := apiServer(t)
	mustCall(t, srv, "POST", "/v1/hosts", `{"name":"h4"}`, 201)
	mustCall(t, srv, "POST", "/v1/hosts", `{"name":"h5"}`, 201)
	// What h4's agent writes itself.
	putNode(t, s, "h4", 1, 0, 0)
	if err := store.PutJSON(t.Context(), s, intent.StatusPrefix+"h4", intent.AgentStatus{Node: "h4"}); err != nil {
		t.Fatal(err)
	}
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	for _, sub := range []string{"web", "ops"} {
		mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"`+sub+`"}`, 201)
	}
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web4","host":"h4"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web1","host":"h1"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/ops/vms", `{"name":"mon","host":"h1"}`, 201)
	mustCall(t, srv, "POST", "/v1/slivers", `{"host":"h4","name":"s1","ports":"10000-10099"}`, 201)
	mustCall(t, srv, "POST", "/v1/taps", `{"name":"watch4","sender":"blue/web/web4","receiver":"any","monitor":"blue/ops/mon"}`, 201)
	mustCall(t, srv, "POST", "/v1/taps", `{"name":"watch1","sender":"blue/web/web1","receiver":"any","monitor":"blue/ops/mon"}`, 201)
	if len(hostKeys(t, s, "h4")) < 5 {
		t.Fatalf("setup: h4 has too few keys to prove anything: %v", hostKeys(t, s, "h4"))
	}

	code, out := call(t, srv, "DELETE", "/v1/hosts/h4", "")
	if code != 409 || out["field"] != "host" || !strings.Contains(out["error"].(string), "blue/web/web4") {
		t.Fatalf("remove with guests placed: %d %v, want 409 naming them", code, out)
	}
	for field, want := range map[string]string{"vms": "blue/web/web4", "slivers": "h4/s1", "taps": "watch4"} {
		got, _ := out[field].([]any)
		if len(got) != 1 || got[0] != want {
			t.Errorf("409's %s: %v, want [%s]", field, out[field], want)
		}
	}
	if deps, _ := out["dependants"].([]any); len(deps) != 3 || deps[0] != "vm blue/web/web4" || deps[1] != "sliver h4/s1" || deps[2] != "tap watch4" {
		t.Errorf("409's dependants: %v, want vm, sliver and tap, KIND NAME each", out["dependants"])
	}
	if _, err := s.Get(t.Context(), intent.HostsPrefix+"h4"); err != nil {
		t.Fatalf("a refused removal removed the host: %v", err)
	}
	if out := mustCall(t, srv, "GET", "/v1/hosts/h4", "", 200); out["name"] != "h4" || len(out["vms"].([]any)) != 1 || len(out["slivers"].([]any)) != 1 {
		t.Errorf("GET /v1/hosts/h4: %v, want web4 and s1 on it", out)
	}
	if code, out := call(t, srv, "GET", "/v1/hosts/H4", ""); code != 400 || out["field"] != "host" {
		t.Errorf("GET a malformed host: %d %v", code, out)
	}
	code, out = call(t, srv, "DELETE", "/v1/hosts/h4?drain=maybe", "")
	if code != 400 || out["field"] != "drain" {
		t.Errorf("drain=maybe: %d %v", code, out)
	}
	code, out = call(t, srv, "DELETE", "/v1/hosts/nope", "")
	if code != 404 || out["field"] != "host" {
		t.Errorf("remove an unknown host: %d %v", code, out)
	}
	// An empty host goes without a drain.
	mustCall(t, srv, "DELETE", "/v1/hosts/h5", "", 204)
	if left := hostKeys(t, s, "h5"); len(left) > 0 {
		t.Errorf("keys of h5 left: %v", left)
	}

	mustCall(t, srv, "DELETE", "/v1/hosts/h4?drain=true", "", 204)
	if left := hostKeys(t, s, "h4"); len(left) > 0 {
		t.Errorf("keys of h4 left after the drain: %v", left)
	}
	if _, err := s.Get(t.Context(), intent.VMKey("blue", "web", "web4")); err == nil {
		t.Error("the drained VM is still in intent")
	}
	// The rest of the cloud is untouched: web1, the monitor and the policy
	// that does not name h4's VM stay.
	mustCall(t, srv, "GET", "/v1/taps/watch1", "", 200)
	mustCall(t, srv, "GET", "/v1/taps/watch4", "", 404)
	if _, err := s.Get(t.Context(), intent.DesiredVMKey("h1", "blue/web/web1")); err != nil {
		t.Errorf("web1's desired key went with h4: %v", err)
	}
	// The drained VM's address is free again: the next VM of its subnet
	// takes the lowest free one, web4's.
	out = mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web5","host":"h1"}`, 201)
	if out["ip"] != "10.1.1.2" {
		t.Errorf("web5 got %v, want web4's freed 10.1.1.2", out["ip"])
	}
	// And h4 may join again, empty.
	mustCall(t, srv, "POST", "/v1/hosts", `{"name":"h4"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web6","host":"h4"}`, 201)
	if _, err := s.Get(t.Context(), intent.DesiredVMKey("h4", "blue/web/web6")); err != nil {
		t.Errorf("a VM on the host added again has no desired key: %v", err)
	}
}

// cascade=true is drain=true under the name every delete uses.
func TestAPIRemovesHostWithCascadeAsWithDrain(t *testing.T) {
	srv, s := apiServer(t)
	mustCall(t, srv, "POST", "/v1/hosts", `{"name":"h4"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web4","host":"h4"}`, 201)
	if code, out := call(t, srv, "DELETE", "/v1/hosts/h4?cascade=no", ""); code != 400 || out["field"] != "cascade" {
		t.Errorf("cascade=no: %d %v", code, out)
	}
	mustCall(t, srv, "DELETE", "/v1/hosts/h4", "", 409)
	mustCall(t, srv, "DELETE", "/v1/hosts/h4?cascade=true", "", 204)
	if left := hostKeys(t, s, "h4"); len(left) > 0 {
		t.Errorf("keys of h4 left after the cascade: %v", left)
	}
	mustCall(t, srv, "GET", "/v1/farms/blue/subnets/web/vms/web4", "", 404)
	mustCall(t, srv, "GET", "/v1/hosts/h4", "", 404)
}
