package controller

import (
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// listIDs GETs path (a list of objects with an id) and returns the ids.
func listIDs(t *testing.T, srv *httptest.Server, path string) []uint32 {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var items []struct {
		ID uint32 `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&items); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
	}
	var ids []uint32
	for _, it := range items {
		ids = append(ids, it.ID)
	}
	return ids
}

// farmVisibility is the compiled visibility farm holds in its farm state,
// what every host with a VM of the farm applies.
func farmVisibility(t *testing.T, s store.Store, farm string) []intent.VisRule {
	t.Helper()
	var f intent.Farm
	if err := store.GetJSON(t.Context(), s, intent.FarmsPrefix+farm, &f); err != nil {
		t.Fatal(err)
	}
	var st intent.FarmState
	if err := store.GetJSON(t.Context(), s, intent.FarmStateKey(f.ID), &st); err != nil {
		t.Fatalf("farm state of %s: %v", farm, err)
	}
	return st.Visibility
}

func TestAPIRuleLifecycleKeepsEveryOtherRulesIDAcrossADelete(t *testing.T) {
	srv, s := apiServer(t)
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	for _, sub := range []string{"web", "db", "ops"} {
		mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"`+sub+`"}`, 201)
	}
	for i, body := range []string{`{"from":"web","to":"db","proto":"tcp","port":5432}`, `{"from":"web","to":"ops"}`, `{"from":"ops","to":"db","proto":"icmp"}`} {
		if out := mustCall(t, srv, "POST", "/v1/farms/blue/rules", body, 201); out["id"] != float64(i+1) {
			t.Fatalf("rule %s got id %v, want %d", body, out["id"], i+1)
		}
	}
	if ids := listIDs(t, srv, "/v1/farms/blue/rules"); !slices.Equal(ids, []uint32{1, 2, 3}) {
		t.Fatalf("ids %v, want 1 2 3", ids)
	}
	if n := len(farmVisibility(t, s, "blue")); n != 3 {
		t.Fatalf("farm state holds %d rules, want 3", n)
	}

	mustCall(t, srv, "DELETE", "/v1/farms/blue/rules/2", "", 204)
	if ids := listIDs(t, srv, "/v1/farms/blue/rules"); !slices.Equal(ids, []uint32{1, 3}) {
		t.Fatalf("after deleting rule 2: ids %v, want 1 3 (rule 3 keeps its id)", ids)
	}
	if out := mustCall(t, srv, "GET", "/v1/farms/blue/rules/3", "", 200); out["from"] != "blue/ops" || out["proto"] != "icmp" || out["effective"] != true {
		t.Fatalf("rule 3: %v", out)
	}
	// What every host applies lost the rule: web (1) -> ops (3) any.
	for _, v := range farmVisibility(t, s, "blue") {
		if v.SrcSubnet == 1 && v.DstSubnet == 3 {
			t.Fatalf("the deleted rule is still compiled: %+v", v)
		}
	}
	// An id is never given twice: a stale delete cannot hit a newer rule.
	if out := mustCall(t, srv, "POST", "/v1/farms/blue/rules", `{"from":"web","to":"ops"}`, 201); out["id"] != 4.0 {
		t.Fatalf("the rule after a delete got id %v, want 4", out["id"])
	}
	for _, c := range []struct {
		method, path, body string
		code               int
		field, msg         string
	}{
		{"GET", "/v1/farms/blue/rules/2", "", 404, "id", "rule 2 of farm blue: not found"},
		{"DELETE", "/v1/farms/blue/rules/2", "", 404, "id", "rule 2 of farm blue: not found"},
		{"DELETE", "/v1/farms/blue/rules/two", "", 400, "id", `rule id "two": want a positive number`},
		{"GET", "/v1/farms/blue/rules/0", "", 400, "id", "want a positive number"},
		{"GET", "/v1/farms/nope/rules", "", 404, "farm", `farm "nope": not found`},
		{"DELETE", "/v1/farms/nope/rules/1", "", 404, "farm", `farm "nope": not found`},
		{"POST", "/v1/farms/blue/rules", `{"id":7,"from":"db","to":"ops"}`, 400, "id", "the controller gives a rule its id"},
		{"POST", "/v1/farms/blue/rules", `{"from":"web","to":"db","proto":"TCP","port":5432}`, 409, "body", "farm blue's rule 1"},
	} {
		code, out := call(t, srv, c.method, c.path, c.body)
		if code != c.code || out["field"] != c.field || !strings.Contains(out["error"].(string), c.msg) {
			t.Errorf("%s %s %s: %d %v, want %d %s %q", c.method, c.path, c.body, code, out, c.code, c.field, c.msg)
		}
	}
}

// Records written before rules had ids: ids come on read, in list order,
// the same every time, and are stored with the record's next write; the
// desired state a host applies does not change for it.
func TestRulesStoredWithoutIDsGetStableIDsAndKeepThemOnTheNextWrite(t *testing.T) {
	c, s := newController()
	putHost(t, s, "h1")
	srv := newAPIServer(t, c)
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	for _, sub := range []string{"web", "db", "ops"} {
		mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"`+sub+`"}`, 201)
	}
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web1","host":"h1"}`, 201)
	var f intent.Farm
	if err := store.GetJSON(t.Context(), s, intent.FarmsPrefix+"blue", &f); err != nil {
		t.Fatal(err)
	}
	f.Rules = []intent.Rule{{From: "blue/web", To: "blue/db"}, {From: "blue/web", To: "blue/ops"}, {From: "blue/ops", To: "blue/db"}}
	var v intent.VM
	if err := store.GetJSON(t.Context(), s, intent.VMKey("blue", "web", "web1"), &v); err != nil {
		t.Fatal(err)
	}
	v.Firewall = &intent.Firewall{DefaultIn: "deny", DefaultOut: "allow", Rules: []intent.FirewallRule{
		{Dir: "in", Proto: "tcp", PortLo: 22, PortHi: 22, Action: "allow"}, {Dir: "in", Proto: "icmp", Action: "allow"}}}
	// As a controller of before wrote them: no id anywhere.
	for key, rec := range map[string]any{intent.FarmsPrefix + "blue": f, intent.VMKey("blue", "web", "web1"): v} {
		b, _ := json.Marshal(rec)
		if strings.Contains(string(b), `"id":`) && key != intent.FarmsPrefix+"blue" {
			t.Fatalf("record %s has ids already: %s", key, b)
		}
		if err := s.Put(t.Context(), key, b); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.CompileOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	desiredKey := intent.DesiredVMKey("h1", "blue/web/web1")
	before, err := s.Get(t.Context(), desiredKey)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if ids := listIDs(t, srv, "/v1/farms/blue/rules"); !slices.Equal(ids, []uint32{1, 2, 3}) {
			t.Fatalf("ids of stored rules %v, want 1 2 3 on every read", ids)
		}
	}
	mustCall(t, srv, "DELETE", "/v1/farms/blue/rules/2", "", 204)
	if err := store.GetJSON(t.Context(), s, intent.FarmsPrefix+"blue", &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Rules) != 2 || f.Rules[0].ID != 1 || f.Rules[1].ID != 3 || f.LastRuleID != 3 {
		t.Fatalf("stored after the delete: %+v, want rules 1 and 3, last id 3", f)
	}

	fw := mustCall(t, srv, "GET", "/v1/farms/blue/subnets/web/vms/web1/firewall", "", 200)
	if rules := fw["rules"].([]any); len(rules) != 2 || rules[1].(map[string]any)["id"] != 2.0 {
		t.Fatalf("firewall of before: %v, want ids 1 and 2", fw)
	}
	after, err := s.Get(t.Context(), desiredKey)
	if err != nil || string(after) != string(before) {
		t.Fatalf("numbering changed web1's desired key (%v):\n%s\n%s", err, before, after)
	}
	mustCall(t, srv, "DELETE", "/v1/farms/blue/subnets/web/vms/web1/firewall/rules/1", "", 200)
	if err := store.GetJSON(t.Context(), s, intent.VMKey("blue", "web", "web1"), &v); err != nil {
		t.Fatal(err)
	}
	if fw := v.Firewall; len(fw.Rules) != 1 || fw.Rules[0].ID != 2 || fw.Rules[0].Proto != "icmp" || fw.LastRuleID != 2 {
		t.Fatalf("stored firewall after deleting rule 1: %+v", fw)
	}
	var ep intent.LocalEndpoint
	if err := store.GetJSON(t.Context(), s, desiredKey, &ep); err != nil {
		t.Fatal(err)
	}
	if ep.Firewall == nil || len(ep.Firewall.Rules) != 1 || ep.Firewall.Rules[0].Proto != "icmp" || ep.Firewall.Rules[0].ID != 0 {
		t.Fatalf("desired firewall after the delete: %+v, want the icmp allow alone, without ids", ep.Firewall)
	}
}

func TestAPIFirewallRulesListAndDeleteByID(t *testing.T) {
	srv, _ := apiServer(t)
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web1","host":"h1"}`, 201)
	path := "/v1/farms/blue/subnets/web/vms/web1/firewall"
	if fw := mustCall(t, srv, "GET", path, "", 200); fw["defaultIn"] != "allow" || fw["defaultOut"] != "allow" || len(fw["rules"].([]any)) != 0 {
		t.Fatalf("a VM without a firewall: %v, want both defaults allow, no rule", fw)
	}
	for _, r := range []string{`{"dir":"in","proto":"tcp","portLo":22,"action":"allow"}`, `{"dir":"in","proto":"tcp","portLo":80,"action":"allow"}`, `{"dir":"out","proto":"udp","action":"deny"}`} {
		mustCall(t, srv, "POST", path, `{"defaultIn":"deny","rule":`+r+`}`, 200)
	}
	fw := mustCall(t, srv, "DELETE", path+"/rules/2", "", 200)
	rules := fw["rules"].([]any)
	if len(rules) != 2 || rules[0].(map[string]any)["id"] != 1.0 || rules[1].(map[string]any)["id"] != 3.0 {
		t.Fatalf("after deleting rule 2: %v, want rules 1 and 3", fw)
	}
	if out := mustCall(t, srv, "POST", path, `{"rule":{"dir":"in","proto":"tcp","portLo":80,"action":"allow"}}`, 200); len(out["rules"].([]any)) != 3 ||
		out["rules"].([]any)[2].(map[string]any)["id"] != 4.0 {
		t.Fatalf("the rule added again: %v, want id 4 (never given twice)", out)
	}
	for _, c := range []struct {
		method, path, body string
		code               int
		field, msg         string
	}{
		{"DELETE", path + "/rules/2", "", 404, "id", "rule 2 of blue/web/web1's firewall: not found"},
		{"DELETE", path + "/rules/x", "", 400, "id", "want a positive number"},
		{"DELETE", "/v1/farms/blue/subnets/web/vms/nope/firewall/rules/1", "", 404, "vm", "vm blue/web/nope: not found"},
		{"GET", "/v1/farms/blue/subnets/web/vms/nope/firewall", "", 404, "vm", "vm blue/web/nope: not found"},
		{"POST", path, `{"rule":{"id":9,"dir":"in","action":"deny"}}`, 400, "rule.id", "the controller gives a rule its id"},
	} {
		code, out := call(t, srv, c.method, c.path, c.body)
		if code != c.code || out["field"] != c.field || !strings.Contains(out["error"].(string), c.msg) {
			t.Errorf("%s %s %s: %d %v, want %d %s %q", c.method, c.path, c.body, code, out, c.code, c.field, c.msg)
		}
	}
}

// A peering a cross-farm TAP policy relies on is not withdrawn behind its
// back: 409 naming the policy, unless cascade deletes the policy first.
func TestAPIUnpeerRefusedWhileACrossFarmTapReliesOnItUnlessCascade(t *testing.T) {
	c, s, _, _ := tapServer(t)
	srv := newAPIServer(t, c)
	mustCall(t, srv, "POST", "/v1/farms/blue/rules", `{"from":"web","to":"red/app","proto":"tcp","port":443}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/red/rules", `{"from":"blue/web","to":"app","proto":"tcp","port":443}`, 201)
	mustCall(t, srv, "POST", "/v1/taps", `{"name":"watch-red","sender":"red/app/app1","receiver":"any","monitor":"blue/ops/mon","crossFarm":true}`, 201)
	mustCall(t, srv, "POST", "/v1/taps", `{"name":"own","sender":"blue/web","receiver":"any","monitor":"blue/ops/mon"}`, 201)
	crossFarm := func() int {
		n := 0
		for _, v := range farmVisibility(t, s, "blue") {
			if v.SrcFarm != v.DstFarm {
				n++
			}
		}
		return n
	}
	if n := crossFarm(); n != 1 {
		t.Fatalf("positive control: %d cross-farm rules compiled, want blue/web -> red/app", n)
	}
	if peers := mustCall(t, srv, "GET", "/v1/farms/blue/peers", "", 200); peers != nil {
		t.Fatalf("peers is a list: %v", peers)
	}
	for _, half := range []string{"/v1/farms/blue/peers/red", "/v1/farms/red/peers/blue"} {
		code, out := call(t, srv, "DELETE", half, "")
		if code != 409 || out["field"] != "with" || !strings.Contains(out["error"].(string), "is in use by tap watch-red: ") || !reflect.DeepEqual(out["dependants"], []any{"tap watch-red"}) {
			t.Fatalf("DELETE %s: %d %v, want 409 naming watch-red only", half, code, out)
		}
	}
	if code, out := call(t, srv, "DELETE", "/v1/farms/blue/peers/red?cascade=maybe", ""); code != 400 || out["field"] != "cascade" {
		t.Fatalf("cascade=maybe: %d %v", code, out)
	}
	if n := crossFarm(); n != 1 {
		t.Fatalf("a refused unpeer changed the compiled rules: %d", n)
	}

	mustCall(t, srv, "DELETE", "/v1/farms/blue/peers/red?cascade=true", "", 204)
	if code, _ := call(t, srv, "GET", "/v1/taps/watch-red", ""); code != 404 {
		t.Fatalf("the tap relying on the peering is still there: %d", code)
	}
	mustCall(t, srv, "GET", "/v1/taps/own", "", 200)
	if n := crossFarm(); n != 0 {
		t.Fatalf("%d cross-farm rules still compiled after unpeer", n)
	}
	var views []PeerView
	for farm, want := range map[string][]PeerView{"blue": {}, "red": {{Farm: "red", With: "blue", Mutual: false}}} {
		resp, err := srv.Client().Get(srv.URL + "/v1/farms/" + farm + "/peers")
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&views)
		resp.Body.Close()
		if err != nil || !slices.Equal(views, want) {
			t.Fatalf("peers of %s: %v %+v, want %+v", farm, err, views, want)
		}
	}
	for _, c := range []struct {
		path       string
		code       int
		field, msg string
	}{
		{"/v1/farms/blue/peers/red", 404, "with", "farm blue's peering with red: not found"},
		{"/v1/farms/nope/peers/red", 404, "farm", `farm "nope": not found`},
	} {
		code, out := call(t, srv, "DELETE", c.path, "")
		if code != c.code || out["field"] != c.field || !strings.Contains(out["error"].(string), c.msg) {
			t.Errorf("DELETE %s: %d %v, want %d %s %q", c.path, code, out, c.code, c.field, c.msg)
		}
	}
	// Red's half alone relies on nothing now.
	mustCall(t, srv, "DELETE", "/v1/farms/red/peers/blue", "", 204)
}

// A topology file applied again names its rules as before: one it dropped
// does not rename the others.
func TestTopologyRulesKeepTheirIDsWhenTheFileIsAppliedAgain(t *testing.T) {
	c, s := newController()
	file := func(rules string) string {
		return "name: t\nhosts: [{name: h1}]\nfarms:\n  - name: blue\n    subnets: [{name: web}, {name: db}, {name: ops}]\n    rules:\n" + rules
	}
	web2db := "      - {from: web, to: db, proto: tcp, port: 5432}\n"
	web2ops := "      - {from: web, to: ops}\n"
	ids := func() map[string]uint32 {
		var f intent.Farm
		if err := store.GetJSON(t.Context(), s, intent.FarmsPrefix+"blue", &f); err != nil {
			t.Fatal(err)
		}
		out := map[string]uint32{}
		for _, r := range f.Rules {
			out[r.To] = r.ID
		}
		return out
	}
	if err := c.ApplyTopology(t.Context(), parse(t, file(web2db+web2ops))); err != nil {
		t.Fatal(err)
	}
	if got := ids(); got["blue/db"] != 1 || got["blue/ops"] != 2 {
		t.Fatalf("ids %v, want db 1 and ops 2", got)
	}
	if err := c.ApplyTopology(t.Context(), parse(t, file(web2ops))); err != nil {
		t.Fatal(err)
	}
	if got := ids(); len(got) != 1 || got["blue/ops"] != 2 {
		t.Fatalf("after the file dropped rule 1: %v, want ops still 2", got)
	}
	if err := c.ApplyTopology(t.Context(), parse(t, file(web2ops+web2db))); err != nil {
		t.Fatal(err)
	}
	if got := ids(); got["blue/ops"] != 2 || got["blue/db"] != 3 {
		t.Fatalf("rule 1 back in the file: %v, want ops 2 and db a new id, 3", got)
	}
}
