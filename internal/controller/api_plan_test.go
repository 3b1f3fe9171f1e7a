package controller

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/desired"
)

// planServer is an API on an empty cloud; the process's plan is the
// default again when the test ends.
func planServer(t *testing.T) (*Controller, *httptest.Server) {
	t.Helper()
	t.Cleanup(func() { addrplan.Set(addrplan.Default()) })
	c, _ := newController()
	srv := httptest.NewServer(c.API())
	t.Cleanup(srv.Close)
	return c, srv
}

func TestPlanIsChosenOnAnEmptyCloudAndItsAddressesFollowIt(t *testing.T) {
	_, srv := planServer(t)
	if code, out := call(t, srv, "GET", "/v1/plan", ""); code != 200 || out["plan"] != "10.0.0.0/8:8/8/8" || out["maxFarms"].(float64) != 255 {
		t.Fatalf("GET /v1/plan on a new cloud: %d %v", code, out)
	}
	code, out := call(t, srv, "PUT", "/v1/plan", `{"plan":"10.0.0.0/8:12/6/6"}`)
	if code != 200 || out["plan"] != "10.0.0.0/8:12/6/6" || out["maxFarms"].(float64) != 4095 || out["maxVMs"].(float64) != 61 {
		t.Fatalf("PUT /v1/plan on an empty cloud: %d %v", code, out)
	}
	if code, out := call(t, srv, "GET", "/v1/plan", ""); code != 200 || out["plan"] != "10.0.0.0/8:12/6/6" {
		t.Fatalf("GET after the PUT: %d %v", code, out)
	}
	mustCall(t, srv, "POST", "/v1/hosts", `{"name":"h1"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	sub := mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`, 201)
	if sub["prefix"] != "10.0.16.64/26" || sub["gateway"] != "10.0.16.65" {
		t.Fatalf("farm 1 subnet 1 in 12/6/6: %v (want 10.0.16.64/26, gateway 10.0.16.65)", sub)
	}
	vm := mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web1","host":"h1"}`, 201)
	if vm["ip"] != "10.0.16.66" {
		t.Fatalf("first VM: %v", vm)
	}
}

func TestPlanChangeOnANonEmptyCloudIs409NamingWhatItHolds(t *testing.T) {
	c, srv := planServer(t)
	mustCall(t, srv, "POST", "/v1/hosts", `{"name":"h1"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	code, out := call(t, srv, "PUT", "/v1/plan", `{"plan":"10.0.0.0/8:12/6/6"}`)
	if code != 409 || out["field"] != "plan" || !strings.Contains(out["error"].(string), "cannot become 10.0.0.0/8:12/6/6: the cloud holds host h1, farm blue") {
		t.Fatalf("plan change with a host and a farm: %d %v", code, out)
	}
	if deps, _ := out["dependants"].([]any); len(deps) != 2 {
		t.Fatalf("dependants %v, want host h1 and farm blue", out["dependants"])
	}
	// Refused, not corrupted: the store and the process keep the plan.
	if p, _, err := desired.Plan(t.Context(), c.raw); err != nil || !p.IsDefault() || !addrplan.Current().IsDefault() {
		t.Fatalf("after the refusal: store %v (%v), process %v", p, err, addrplan.Current())
	}
	if code, out := call(t, srv, "PUT", "/v1/plan", `{"plan":"10.0.0.0/8:8/8/8"}`); code != 200 {
		t.Fatalf("the plan in force again: %d %v", code, out)
	}
	if code, out := call(t, srv, "PUT", "/v1/plan", `{"plan":"10.0.0.0/8:12/6/5"}`); code != 400 || !strings.Contains(out["error"].(string), "has 23 bits") {
		t.Fatalf("an invalid plan: %d %v", code, out)
	}
	// The daemon's start takes the same path: a --plan unlike the store's.
	err := c.choosePlan(t.Context(), "10.0.0.0/8:12/6/6", nil)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "--plan: plan: the address plan is 10.0.0.0/8:8/8/8 and cannot become") {
		t.Fatalf("--plan on a non-empty cloud: %v", err)
	}
}

// A plan body on the fuzz topology's cloud, which holds hosts and farms:
// every answer is below 500 and names its field (fuzzAPI), none is a 200
// for another plan, and neither the store's plan nor the process's moves.
func FuzzAPIPlanBody(f *testing.F) {
	seedBodies(f, `{"plan":"10.0.0.0/8:12/6/6"}`, `{"plan":"10.0.0.0/8:8/8/8"}`, `{"plan":"12/6/6"}`, `{"plan":"10.0.0.0/8:8/8/7"}`,
		`{"plan":""}`, `{"plan":7}`, `{"pln":"x"}`, `{`, ``, `null`, `{"plan":"0.0.0.0/0:16/8/8"}`)
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, body string) {
		t.Cleanup(func() { addrplan.Set(addrplan.Default()) })
		s, code := send(t, "PUT", "/v1/plan", body)
		p, _, err := desired.Plan(t.Context(), s)
		if err != nil || !p.IsDefault() || !addrplan.Current().IsDefault() {
			t.Fatalf("PUT /v1/plan %q (%d) on a cloud with farms: store plan %v (%v), process %v", body, code, p, err, addrplan.Current())
		}
		if code == 200 && !strings.Contains(body, "8/8/8") {
			t.Fatalf("PUT /v1/plan %q answered 200 on a cloud with farms", body)
		}
	})
}
