package controller

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

func TestAPISubnetDeleteIsRefusedNamingItsDependantsAndCascadeFreesItsIDs(t *testing.T) {
	srv, s := twoFarms(t)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/db/vms", `{"name":"db2","host":"h1"}`, 201)
	out := mustCall(t, srv, "GET", "/v1/farms/blue/subnets/db", "", 200)
	if out["prefix"] != "10.1.2.0/24" || out["id"] != 2.0 {
		t.Fatalf("GET subnet blue/db: %v", out)
	}
	var subs []intent.Subnet
	if err := json.Unmarshal(get(t, srv, "/v1/farms/blue/subnets"), &subs); err != nil || len(subs) != 2 || subs[0].Name != "db" || subs[1].Name != "web" {
		t.Fatalf("GET blue's subnets: %+v %v", subs, err)
	}

	code, out := call(t, srv, "DELETE", "/v1/farms/blue/subnets/db", "")
	got := dependantsOf409(t, code, out, "subnet")
	want := []string{"vm blue/db/db1", "vm blue/db/db2", "rule of farm blue: blue/web -> blue/db tcp/5432",
		"rule of farm red: red/web -> blue/db tcp/5432", "tap mon"}
	if !slices.Equal(got, want) {
		t.Fatalf("dependants %q, want %q", got, want)
	}
	// The other subnet is held by web1, which the tap names as its sender.
	code, out = call(t, srv, "DELETE", "/v1/farms/blue/subnets/web", "")
	if got := dependantsOf409(t, code, out, "subnet"); !slices.Equal(got, []string{"vm blue/web/web1", "rule of farm blue: blue/web -> blue/db tcp/5432", "tap mon"}) {
		t.Errorf("blue/web's dependants %q", got)
	}

	mustCall(t, srv, "DELETE", "/v1/farms/blue/subnets/db?cascade=true", "", 204)
	if left := keysNaming(t, s, "blue/db", "db1", "db2", "10.1.2."); len(left) > 0 {
		t.Errorf("keys left after the cascade:\n%s", strings.Join(left, "\n"))
	}
	for _, f := range []string{"blue", "red"} {
		if out := mustCall(t, srv, "GET", "/v1/farms/"+f, "", 200); out["rules"] != nil {
			t.Errorf("farm %s still has rules after blue/db went: %v", f, out["rules"])
		}
	}
	// The farm, its other subnet and its VM stay, and the peering.
	if out := mustCall(t, srv, "GET", "/v1/farms/blue", "", 200); len(out["peers"].([]any)) != 1 {
		t.Errorf("blue lost its peering with red: %v", out)
	}
	mustCall(t, srv, "GET", "/v1/farms/blue/subnets/web/vms/web1", "", 200)
	mustCall(t, srv, "GET", "/v1/farms/blue/subnets/db", "", 404)

	// Its id and its VMs' addresses are free: a new subnet takes id 2 and
	// its first VM db1's 10.1.2.2.
	if out := mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"store"}`, 201); out["id"] != 2.0 {
		t.Errorf("blue/store got id %v, want db's freed 2", out["id"])
	}
	if out := mustCall(t, srv, "POST", "/v1/farms/blue/subnets/store/vms", `{"name":"st1","host":"h2"}`, 201); out["ip"] != "10.1.2.2" {
		t.Errorf("st1 got %v, want db1's freed 10.1.2.2", out["ip"])
	}
	// An empty subnet goes without a cascade; errors name the field.
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"spare"}`, 201)
	mustCall(t, srv, "DELETE", "/v1/farms/blue/subnets/spare", "", 204)
	for _, c := range []struct {
		path  string
		code  int
		field string
	}{
		{"/v1/farms/blue/subnets/spare", 404, "subnet"},
		{"/v1/farms/nope/subnets/web", 404, "farm"},
		{"/v1/farms/blue/subnets/Web!", 400, "subnet"},
		{"/v1/farms/blue/subnets/web?cascade=maybe", 400, "cascade"},
	} {
		if code, out := call(t, srv, "DELETE", c.path, ""); code != c.code || out["field"] != c.field {
			t.Errorf("DELETE %s: %d %v, want %d naming %s", c.path, code, out, c.code, c.field)
		}
	}
}
