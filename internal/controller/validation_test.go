package controller

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// apiCase is one request and what the API must answer: the status, the
// field it names and a part of its message.
type apiCase struct {
	method, path, body string
	code               int
	field, msg         string
}

func (c apiCase) check(t *testing.T, code int, out map[string]any) {
	t.Helper()
	if code != c.code {
		t.Fatalf("%s %s %.80s: status %d, want %d (%v)", c.method, c.path, c.body, code, c.code, out)
	}
	if c.field != "" && out["field"] != c.field {
		t.Errorf("%s %s %.80s: field %v, want %s (%v)", c.method, c.path, c.body, out["field"], c.field, out)
	}
	if msg, _ := out["error"].(string); !strings.Contains(msg, c.msg) {
		t.Errorf("%s %s %.80s: error %q, want it to contain %q", c.method, c.path, c.body, msg, c.msg)
	}
}

func runCases(t *testing.T, srvCall func(method, path, body string) (int, map[string]any), cases []apiCase) {
	t.Helper()
	for _, c := range cases {
		code, out := srvCall(c.method, c.path, c.body)
		c.check(t, code, out)
	}
}

// blueWithVM makes farm blue, subnets web and db, and web1 on h1.
func blueWithVM(t *testing.T) (func(method, path, body string) (int, map[string]any), *store.Memory) {
	srv, s := apiServer(t)
	do := func(method, path, body string) (int, map[string]any) { return call(t, srv, method, path, body) }
	runCases(t, do, []apiCase{
		{method: "POST", path: "/v1/farms", body: `{"name":"blue"}`, code: 201},
		{method: "POST", path: "/v1/farms/blue/subnets", body: `{"name":"web"}`, code: 201},
		{method: "POST", path: "/v1/farms/blue/subnets", body: `{"name":"db"}`, code: 201},
		{method: "POST", path: "/v1/farms/blue/subnets/web/vms", body: `{"name":"web1","host":"h1"}`, code: 201},
	})
	return do, s
}

const fwPath = "/v1/farms/blue/subnets/web/vms/web1/firewall"

// The datapath matches portLo..portHi when portLo is set and ignores portHi
// when it is not: portHi alone matched every port, portLo alone none, and
// lo > hi none. The API takes portLo alone as one port and rejects the rest,
// naming the field.
func TestAPIFirewallPortRangesAreOneMeaningOrRejected(t *testing.T) {
	do, s := blueWithVM(t)
	rule := func(fields string) string {
		return `{"rule":{"dir":"in","action":"deny",` + fields + `}}`
	}
	runCases(t, do, []apiCase{
		{"POST", fwPath, rule(`"proto":"tcp","portHi":80`), 400, "rule.portLo", "portHi 80 without portLo"},
		{"POST", fwPath, rule(`"proto":"tcp","portLo":90,"portHi":80`), 400, "rule.portHi", "portHi 80 is below portLo 90"},
		{"POST", fwPath, rule(`"proto":"icmp","portHi":80`), 400, "rule.portLo", "without portLo"},
		{"POST", fwPath, rule(`"proto":"icmp","portLo":80`), 400, "rule.portLo", "ports need proto tcp or udp"},
		{"POST", fwPath, rule(`"proto":"tcp","portLo":70000`), 400, "rule.portLo", "want a uint16"},
		{"POST", fwPath, rule(`"proto":"tcp","portLo":22`), 200, "", ""},
		{"POST", fwPath, rule(`"proto":"udp","portLo":8000,"portHi":8080`), 200, "", ""},
	})
	var v intent.VM
	if err := store.GetJSON(t.Context(), s, intent.VMsPrefix+"blue/web/web1", &v); err != nil {
		t.Fatal(err)
	}
	if v.Firewall == nil || len(v.Firewall.Rules) != 2 {
		t.Fatalf("stored firewall %+v, want the two valid rules", v.Firewall)
	}
	if r := v.Firewall.Rules[0]; r.PortLo != 22 || r.PortHi != 22 {
		t.Errorf("portLo 22 alone stored as %d..%d, want 22..22 (the datapath needs portHi)", r.PortLo, r.PortHi)
	}
	if r := v.Firewall.Rules[1]; r.PortLo != 8000 || r.PortHi != 8080 {
		t.Errorf("range stored as %d..%d", r.PortLo, r.PortHi)
	}
}

// Enum-like fields are stored lowercase (and proto "any" as ""), so a rule
// that differs from another only in case is the same rule: a duplicate.
func TestAPIRuleThatDiffersOnlyInCaseIsADuplicate(t *testing.T) {
	do, s := blueWithVM(t)
	runCases(t, do, []apiCase{
		{"POST", "/v1/farms/blue/rules", `{"from":"web","to":"db","proto":"tcp","port":5432}`, 201, "", ""},
		{"POST", "/v1/farms/blue/rules", `{"from":"web","to":"db","proto":"TCP","port":5432}`, 409, "body", "already exists"},
		{"POST", "/v1/farms/blue/rules", `{"from":"blue/web","to":"db","proto":"Tcp","port":5432}`, 409, "body", "rule blue/web -> blue/db tcp/5432"},
		{"POST", "/v1/farms/blue/rules", `{"from":"web","to":"db","proto":"ANY"}`, 201, "", ""},
		{"POST", "/v1/farms/blue/rules", `{"from":"web","to":"db"}`, 409, "body", "already exists"},
		{"POST", fwPath, `{"rule":{"dir":"IN","proto":"TCP","portLo":22,"portHi":22,"action":"Deny"},"defaultIn":"DENY"}`, 200, "", ""},
		{"POST", fwPath, `{"rule":{"dir":"in","proto":"tcp","portLo":22,"action":"deny"}}`, 409, "rule", "the same rule as rule 1"},
		{"POST", fwPath, `{"defaultOut":"maybe"}`, 400, "defaultOut", `defaultOut "maybe": want allow or deny`},
		{"POST", fwPath, `{"rule":null}`, 400, "body", "nothing to add"},
		{"POST", fwPath, `{"rule":{"dir":"in","proto":"tcp","cidr":"10.1.2.7/24","action":"allow"}}`, 200, "", ""},
		{"POST", fwPath, `{"rule":{"dir":"in","proto":"tcp","cidr":"10.1.2.0/24","action":"allow"}}`, 409, "rule", "the same rule as rule 2"},
	})
	var f intent.Farm
	if err := store.GetJSON(t.Context(), s, intent.FarmsPrefix+"blue", &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Rules) != 2 || f.Rules[0].Proto != "tcp" || f.Rules[1].Proto != "" {
		t.Errorf("stored rules %+v, want tcp/5432 and any", f.Rules)
	}
	var v intent.VM
	if err := store.GetJSON(t.Context(), s, intent.VMsPrefix+"blue/web/web1", &v); err != nil {
		t.Fatal(err)
	}
	if fw := v.Firewall; fw == nil || fw.DefaultIn != "deny" || len(fw.Rules) != 2 ||
		fw.Rules[0] != (intent.FirewallRule{Dir: "in", Proto: "tcp", PortLo: 22, PortHi: 22, Action: "deny"}) {
		t.Errorf("stored firewall %+v, want lowercase fields", fw)
	}
}

// Farm 256 got HTTP 500. Every id range that runs out is a 409 that says
// how big it is and that none is left.
func TestAPIIDsRunningOutIsAConflictSayingNoneAreLeft(t *testing.T) {
	srv, _ := apiServer(t)
	do := func(method, path, body string) (int, map[string]any) { return call(t, srv, method, path, body) }
	for i := 0; i < 255; i++ {
		runCases(t, do, []apiCase{{method: "POST", path: "/v1/farms", body: fmt.Sprintf(`{"name":"f%d"}`, i), code: 201}})
	}
	for i := 0; i < 255; i++ {
		runCases(t, do, []apiCase{{method: "POST", path: "/v1/farms/f0/subnets", body: fmt.Sprintf(`{"name":"s%d"}`, i), code: 201}})
	}
	for i := 0; i < 253; i++ {
		runCases(t, do, []apiCase{{method: "POST", path: "/v1/farms/f0/subnets/s0/vms", body: fmt.Sprintf(`{"name":"v%d","host":"h1"}`, i), code: 201}})
	}
	runCases(t, do, []apiCase{
		{"POST", "/v1/farms", `{"name":"f255"}`, 409, "name", "all 255 of 1..255 are in use, 0 left"},
		{"POST", "/v1/farms/f0/subnets", `{"name":"s255"}`, 409, "farm", "no free id left for a subnet in farm f0: all 255 of 1..255 are in use, 0 left"},
		{"POST", "/v1/farms/f0/subnets/s0/vms", `{"name":"v253","host":"h1"}`, 409, "subnet", "no free id left for a VM in subnet f0/s0: all 253 of 2..254 are in use, 0 left"},
		// Another farm's subnets and another subnet's VMs are not affected.
		{"POST", "/v1/farms/f1/subnets", `{"name":"s0"}`, 201, "", ""},
		{"POST", "/v1/farms/f0/subnets/s1/vms", `{"name":"v253","host":"h1"}`, 201, "", ""},
	})
}

// A body is one JSON object: data after it is an error that says where,
// and nothing of the request is done.
func TestAPIRejectsDataAfterTheJSONBody(t *testing.T) {
	srv, _ := apiServer(t)
	do := func(method, path, body string) (int, map[string]any) { return call(t, srv, method, path, body) }
	runCases(t, do, []apiCase{
		{"POST", "/v1/farms", `{"name":"blue"} garbage`, 400, "body", "unexpected data after the JSON object, at byte 15"},
		{"POST", "/v1/farms", `{"name":"blue"}{"name":"red"}`, 400, "body", "at byte 15"},
		{"POST", "/v1/farms", `{"name":"blue"}]`, 400, "body", "at byte 15"},
		{"POST", "/v1/farms", ``, 400, "body", "empty"},
		{"POST", "/v1/farms", `[]`, 400, "body", "want a JSON object"},
		{"POST", "/v1/farms", `{"name":7}`, 400, "name", "name is a number, want a string"},
	})
	resp, err := http.Get(srv.URL + "/v1/farms")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var farms []intent.Farm
	if err := json.NewDecoder(resp.Body).Decode(&farms); err != nil || len(farms) != 0 {
		t.Fatalf("a rejected body created farms %+v (%v)", farms, err)
	}
	runCases(t, do, []apiCase{{"POST", "/v1/farms", "{\"name\":\"blue\"}\n\t ", 201, "", ""}})
}

// A body over the limit was cut off and reported as "unexpected EOF": it is
// 413 with the limit in the message.
func TestAPIBodyOverTheLimitIs413WithTheLimit(t *testing.T) {
	srv, _ := apiServer(t)
	do := func(method, path, body string) (int, map[string]any) { return call(t, srv, method, path, body) }
	big := `{"name":"` + strings.Repeat("a", MaxBody) + `"}`
	trailing := `{"name":"blue"}` + strings.Repeat(" ", MaxBody)
	runCases(t, do, []apiCase{
		{"POST", "/v1/farms", big, 413, "body", "larger than the limit of 1048576 bytes"},
		{"POST", "/v1/farms", trailing, 413, "body", "larger than the limit of 1048576 bytes"},
		{"POST", "/v1/farms/blue/subnets/web/vms/web1/firewall", big, 413, "body", "1048576"},
	})
}

// VMs and hosts share one set of node names (the lab's namespaces are
// oh-LAB-NAME for both): a VM named like a host is refused, as the topology
// file refuses it, and so is a second VM of one name in a farm. Names are
// at most 11 bytes, as a topology's are.
// Names are the tenant's: a VM's name is unique within its farm, not across
// the cloud. red may have a web1 beside blue's, on the same host, with its
// own address and interface; a second web1 in blue is refused, in another
// subnet too, until blue's is deleted; a host cannot take a name VMs have
// (the conflict names them all). A controller started on the same store
// knows all of it.
func TestAPIVMNamesAreUniqueWithinAFarmOnly(t *testing.T) {
	do, s := blueWithVM(t)
	runCases(t, do, []apiCase{
		{"POST", "/v1/farms", `{"name":"red"}`, 201, "", ""},
		{"POST", "/v1/farms/red/subnets", `{"name":"web"}`, 201, "", ""},
	})
	code, red := do("POST", "/v1/farms/red/subnets/web/vms", `{"name":"web1","host":"h1"}`)
	if code != 201 {
		t.Fatalf("red/web/web1 beside blue/web/web1: %d %v", code, red)
	}
	blue := vmAt(t, s, "blue/web/web1")
	if red["host"] != "h1" || red["ip"] == blue.IP || red["interface"] != intent.VifName("red", "web1") || blue.Interface != intent.VifName("blue", "web1") {
		t.Fatalf("red/web/web1 %v, blue/web/web1 %+v: want one host, two addresses, each its own VifName", red, blue)
	}
	runCases(t, do, []apiCase{
		{"POST", "/v1/farms/blue/subnets/db/vms", `{"name":"web1","host":"h1"}`, 409, "name", "vm blue/web/web1 (a VM's name is unique within its farm)"},
		{"POST", "/v1/farms/red/subnets/web/vms", `{"name":"web1","host":"h1"}`, 409, "name", "vm red/web/web1"},
		{"POST", "/v1/hosts", `{"name":"web1"}`, 409, "name", "vm blue/web/web1, red/web/web1 (VMs and hosts share one set of node names)"},
		{"DELETE", "/v1/farms/blue/subnets/web/vms/web1", "", 204, "", ""},
		{"POST", "/v1/farms/blue/subnets/db/vms", `{"name":"web1","host":"h1"}`, 201, "", ""},
	})
	_, err := New(s, slog.New(slog.DiscardHandler)).CreateVM(t.Context(), "blue", "web", "web1", "h1")
	if err == nil || !strings.Contains(err.Error(), "vm blue/db/web1 (a VM's name is unique within its farm)") {
		t.Errorf("a controller on the same store created a second blue web1: %v", err)
	}
	if _, err := New(s, slog.New(slog.DiscardHandler)).CreateVM(t.Context(), "red", "web", "web2", "h1"); err != nil {
		t.Errorf("red/web/web2: %v", err)
	}
}

// vmAt reads FARM/SUBNET/VM's record from the store.
func vmAt(t *testing.T, s store.Store, full string) intent.VM {
	t.Helper()
	var v intent.VM
	if err := store.GetJSON(t.Context(), s, intent.VMsPrefix+full, &v); err != nil {
		t.Fatalf("vm %s: %v", full, err)
	}
	return v
}

func TestAPIRefusesVMNamesThatCollideWithNodes(t *testing.T) {
	do, _ := blueWithVM(t)
	runCases(t, do, []apiCase{
		{"POST", "/v1/farms/blue/subnets/web/vms", `{"name":"h1","host":"h1"}`, 409, "name", `host "h1"`},
		{"POST", "/v1/farms/blue/subnets/db/vms", `{"name":"web1","host":"h1"}`, 409, "name", `vm blue/web/web1 (a VM's name is unique within its farm)`},
		{"POST", "/v1/farms/blue/subnets/web/vms", `{"name":"fabric","host":"h1"}`, 400, "name", "reserved"},
		{"POST", "/v1/farms/blue/subnets/web/vms", `{"name":"controller","host":"h1"}`, 400, "name", "reserved"},
		{"POST", "/v1/farms/blue/subnets/web/vms", `{"name":"abcdefghijkl","host":"h1"}`, 400, "name", "at most 11"},
		{"POST", "/v1/farms/blue/subnets/web/vms", `{"name":"abcdefghijk","host":"h1"}`, 201, "", ""},
	})
}

// A route that does not exist answers like every other error: JSON naming
// what to fix (the path), not the router's plain-text page.
func TestAPIUnknownRouteIsAJSONErrorNamingThePath(t *testing.T) {
	srv, _ := apiServer(t)
	do := func(method, path, body string) (int, map[string]any) { return call(t, srv, method, path, body) }
	runCases(t, do, []apiCase{
		{"DELETE", "/v1/farms", ``, 404, "path", "no operation DELETE /v1/farms"},
		{"GET", "/v1/nothing", ``, 404, "path", "no operation GET /v1/nothing"},
	})
}
