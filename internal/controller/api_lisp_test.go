package controller

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// listCall GETs a list.
func listCall(t *testing.T, srv *httptest.Server, path string) []map[string]any {
	t.Helper()
	resp, err := http.Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []map[string]any
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d", path, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return out
}

func TestAPIAddsListsGetsAndDeletesLISPMappingsWithDefaults(t *testing.T) {
	srv, _ := apiServer(t)
	out := mustCall(t, srv, "POST", "/v1/lisp/mappings",
		`{"eid":"10.99.0.0/16","locators":[{"addr":"192.168.100.11"},{"addr":"192.168.100.12","priority":2,"weight":10}]}`, 201)
	locs := out["locators"].([]any)
	l0, l1 := locs[0].(map[string]any), locs[1].(map[string]any)
	if out["eid"] != "10.99.0.0/16" || out["ttlMinutes"] != 1440.0 || out["action"] != "no-action" || out["source"] != "api" ||
		out["authoritative"] != true || l0["priority"] != 1.0 || l0["weight"] != 100.0 || l0["mPriority"] != 255.0 ||
		l0["reachable"] != true || l1["priority"] != 2.0 || l1["weight"] != 10.0 {
		t.Fatalf("created %v", out)
	}
	neg := mustCall(t, srv, "POST", "/v1/lisp/mappings", `{"eid":"10.98.0.0/24","ttlMinutes":5}`, 201)
	if neg["action"] != "native-forward" || len(neg["locators"].([]any)) != 0 || neg["ttlMinutes"] != 5.0 {
		t.Fatalf("negative mapping %v", neg)
	}
	list := listCall(t, srv, "/v1/lisp/mappings")
	if len(list) != 2 || list[0]["eid"] != "10.98.0.0/24" || list[1]["eid"] != "10.99.0.0/16" {
		t.Fatalf("list %v: want both, by EID", list)
	}
	if got := mustCall(t, srv, "GET", "/v1/lisp/mappings/10.99.0.0/16", "", 200); got["eid"] != "10.99.0.0/16" {
		t.Fatalf("get %v", got)
	}
	mustCall(t, srv, "DELETE", "/v1/lisp/mappings/10.99.0.0/16", "", 204)
	if code, out := call(t, srv, "GET", "/v1/lisp/mappings/10.99.0.0/16", ""); code != 404 || out["field"] != "eid" {
		t.Fatalf("after delete: %d %v", code, out)
	}
	if code, out := call(t, srv, "DELETE", "/v1/lisp/mappings/10.99.0.0/16", ""); code != 404 || out["field"] != "eid" {
		t.Fatalf("delete again: %d %v", code, out)
	}
}

func TestAPILISPMappingErrorsNameTheField(t *testing.T) {
	srv, _ := apiServer(t)
	mustCall(t, srv, "POST", "/v1/lisp/mappings", `{"eid":"10.99.0.0/16","locators":[{"addr":"192.168.100.11"}]}`, 201)
	for _, tc := range []struct {
		body, field string
		code        int
	}{
		{`{"eid":"10.99.0.0"}`, "eid", 400},
		{`{"eid":"10.99.0.1/16"}`, "eid", 400},
		{`{"eid":"10.97.0.0/16","locators":[{"addr":"192.168.100.11"},{"addr":"nope"}]}`, "locators[1].addr", 400},
		{`{"eid":"10.97.0.0/16","locators":[{"addr":"192.168.100.11","weight":300}]}`, "locators[0].weight", 400},
		{`{"eid":"10.97.0.0/16","locators":[{"addr":"192.168.100.11","priority":-1}]}`, "locators[0].priority", 400},
		{`{"eid":"10.97.0.0/16","locators":[{"addr":"192.168.100.11"},{"addr":"192.168.100.11"}]}`, "locators[1].addr", 400},
		{`{"eid":"10.97.0.0/16","action":"explode"}`, "action", 400},
		{`{"eid":"10.97.0.0/16","ttlMinutes":-1}`, "ttlMinutes", 400},
		{`{"eid":"10.97.0.0/16","rlocs":[]}`, "rlocs", 400},
		{`{"eid":"10.99.0.0/16"}`, "eid", 409},
	} {
		code, out := call(t, srv, "POST", "/v1/lisp/mappings", tc.body)
		if code != tc.code || out["field"] != tc.field {
			t.Errorf("%s: %d %v, want %d naming %s", tc.body, code, out, tc.code, tc.field)
		}
	}
	if code, out := call(t, srv, "DELETE", "/v1/lisp/mappings/10.99.0.1/16", ""); code != 400 || out["field"] != "eid" {
		t.Errorf("delete with host bits: %d %v", code, out)
	}
	if code, out := call(t, srv, "GET", "/v1/lisp/mappings/nope/16", ""); code != 400 || out["field"] != "eid" {
		t.Errorf("get nope/16: %d %v", code, out)
	}
}
