package controller

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

func TestAPIVMGetListDeleteAndTheFreedAddressGoesToTheNextVM(t *testing.T) {
	srv, s := twoFarms(t)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web2","host":"h2"}`, 201)
	out := mustCall(t, srv, "GET", "/v1/farms/blue/subnets/web/vms/web1", "", 200)
	if out["ip"] != "10.1.1.2" || out["host"] != "h1" || out["mac"] != "02:00:0a:01:01:02" {
		t.Fatalf("GET web1: %v", out)
	}
	var vms []intent.VM
	if err := json.Unmarshal(get(t, srv, "/v1/farms/blue/vms"), &vms); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range vms {
		names = append(names, v.FullName())
	}
	if strings.Join(names, " ") != "blue/db/db1 blue/web/web1 blue/web/web2" {
		t.Fatalf("GET blue's VMs: %v, want db1, web1, web2 and not red's r1", names)
	}

	mustCall(t, srv, "DELETE", "/v1/farms/blue/subnets/web/vms/web1", "", 204)
	if _, err := s.Get(t.Context(), intent.DesiredVMKey("h1", "blue/web/web1")); err == nil {
		t.Error("web1's desired key is still on h1")
	}
	// Nothing of web1 is left but the TAP policy naming it: a policy is
	// the operator's, and says it copies nothing until its VM is back
	// (docs/tap.md); a VM's delete never waits on one (a CNI DEL must not
	// fail).
	for _, k := range keysNaming(t, s, "web1", "10.1.1.2\"") {
		if !strings.HasPrefix(k, intent.TapsPrefix+"mon ") {
			t.Errorf("key of web1 left: %s", k)
		}
	}
	if out := mustCall(t, srv, "GET", "/v1/taps/mon", "", 200); !strings.Contains(out["problem"].(string), "blue/web/web1") {
		t.Errorf("tap mon after its sender went: %v, want a problem naming it", out)
	}
	code, out := call(t, srv, "GET", "/v1/farms/blue/subnets/web/vms/web1", "")
	if code != 404 || out["field"] != "vm" {
		t.Errorf("GET a deleted VM: %d %v", code, out)
	}
	// web1's address is the lowest free one again.
	out = mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web3","host":"h2"}`, 201)
	if out["ip"] != "10.1.1.2" {
		t.Errorf("web3 got %v, want web1's freed 10.1.1.2", out["ip"])
	}
	if _, err := s.Get(t.Context(), intent.DesiredVMKey("h2", "blue/web/web3")); err != nil {
		t.Errorf("web3 has no desired key on h2: %v", err)
	}

	for _, c := range []struct {
		method, path string
		code         int
		field        string
	}{
		{"GET", "/v1/farms/nope/subnets/web/vms/web2", 404, "farm"},
		{"GET", "/v1/farms/blue/subnets/nope/vms/web2", 404, "subnet"},
		{"GET", "/v1/farms/blue/subnets/web/vms/nope", 404, "vm"},
		{"GET", "/v1/farms/blue/subnets/web/vms/Web2", 400, "vm"},
		{"GET", "/v1/farms/blue/subnets/w_b/vms/web2", 400, "subnet"},
		{"GET", "/v1/farms/BLUE/vms", 400, "farm"},
		{"DELETE", "/v1/farms/blue/subnets/web/vms/averyverylongname", 400, "vm"},
		{"DELETE", "/v1/farms/blue/subnets/web/vms/web1", 404, "vm"},
	} {
		if code, out := call(t, srv, c.method, c.path, ""); code != c.code || out["field"] != c.field {
			t.Errorf("%s %s: %d %v, want %d naming %s", c.method, c.path, code, out, c.code, c.field)
		}
	}
}
