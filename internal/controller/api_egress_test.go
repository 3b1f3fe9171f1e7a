package controller

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/topology"
)

func sliceOf(t *testing.T, vm map[string]any) string {
	t.Helper()
	e, ok := vm["egress"].(map[string]any)
	if !ok {
		return "-"
	}
	sl := e["slice"].(map[string]any)
	return fmt.Sprintf("%v-%v", sl["lo"], sl["hi"])
}

// Slices are leases of the host's address: they pack from 1024 past
// slivers' leases, skip the host's ephemeral range, go with their VM, and
// a sliver cannot take one.
func TestEgressSlicesAreLeasesOfTheHostsAddressBesideSlivers(t *testing.T) {
	srv, s := apiServer(t)
	putHost(t, s, "h2")
	putNode(t, s, "h1", 1, 32768, 60999)
	putNode(t, s, "h2", 1, 32768, 60999)
	mustCall(t, srv, "POST", "/v1/slivers", `{"host":"h1","name":"s1","ports":"1024-1100"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"a","host":"h1"}`, 201)

	for _, c := range []struct{ body, want string }{
		{`{"enabled":true,"slice":8}`, "slice of 8 ports: want 16..4096"},
		{`{"enabled":true,"slice":5000}`, "slice of 5000 ports: want 16..4096"},
		{`{"enabled":true,"to":["10.0.0.1/8"]}`, `destination 1 "10.0.0.1/8" has host bits set: did you mean 10.0.0.0/8?`},
		{`{"enabled":true,"to":["2001:db8::/32"]}`, "want an IPv4 prefix"},
		{`{"enabled":false,"slice":64}`, "pass --egress to turn it on"},
	} {
		code, out := call(t, srv, "PUT", "/v1/farms/blue/egress", c.body)
		if code != 400 || !strings.Contains(out["error"].(string), c.want) {
			t.Errorf("%s: %d %v, want 400 naming %q", c.body, code, out, c.want)
		}
	}

	f := mustCall(t, srv, "PUT", "/v1/farms/blue/egress", `{"enabled":true,"slice":100,"to":["192.168.100.0/24"]}`, 200)
	if e := f["egress"].(map[string]any); e["slice"] != 100.0 {
		t.Fatalf("farm: %v", f)
	}
	a := mustCall(t, srv, "GET", "/v1/farms/blue/subnets/web/vms/a", ``, 200)
	if got := sliceOf(t, a); got != "1101-1200" {
		t.Errorf("a's slice %s, want 1101-1200 (past s1's lease 1024-1100)", got)
	}
	b := mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"b","host":"h1"}`, 201)
	if got := sliceOf(t, b); got != "1201-1300" {
		t.Errorf("b's slice %s, want 1201-1300", got)
	}
	// A sliver may not lease a VM's slice.
	code, out := call(t, srv, "POST", "/v1/slivers", `{"host":"h1","name":"s2","ports":"1250-1260"}`)
	if code != 409 || !strings.Contains(out["error"].(string), "egress slice of blue/web/b") {
		t.Errorf("sliver over b's slice: %d %v, want 409 naming b's slice", code, out)
	}
	// a moves to h2: a slice of h2's address; its old one is free for the next VM on h1.
	moved := mustCall(t, srv, "PUT", "/v1/farms/blue/subnets/web/vms/a/host", `{"host":"h2"}`, 200)
	if got := sliceOf(t, moved); got != "1024-1123" {
		t.Errorf("a on h2: slice %s, want 1024-1123", got)
	}
	c := mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"c","host":"h1"}`, 201)
	if got := sliceOf(t, c); got != "1101-1200" {
		t.Errorf("c's slice %s, want a's old 1101-1200", got)
	}
	// Off takes every slice back.
	mustCall(t, srv, "PUT", "/v1/farms/blue/egress", `{"enabled":false}`, 200)
	for _, vm := range []string{"a", "b", "c"} {
		if got := sliceOf(t, mustCall(t, srv, "GET", "/v1/farms/blue/subnets/web/vms/"+vm, ``, 200)); got != "-" {
			t.Errorf("%s after egress off: slice %s", vm, got)
		}
	}
}

// FuzzAPIEgressBody: any body for a farm's egress is a 200 or a 4xx naming
// its field, never a 5xx (fuzzAPI checks both), and a refused one leaves
// the farm's egress as it was (off).
func FuzzAPIEgressBody(f *testing.F) {
	seedBodies(f, `{"enabled":true}`, `{"enabled":true,"to":["192.0.2.0/24"],"slice":512}`, `{"enabled":false}`,
		`{"enabled":true,"slice":1}`, `{"enabled":true,"to":["10.0.0.0/8"]}`, `{"enabled":true,"to":["x"]}`,
		`{"enabled":"yes"}`, `{"slice":-1}`, `{`, ``, `null`)
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, body string) {
		s, code := send(t, "PUT", "/v1/farms/blue/egress", body)
		if code == http.StatusOK {
			return
		}
		b, err := s.Get(t.Context(), intent.FarmsPrefix+"blue")
		var farm intent.Farm
		if err != nil || json.Unmarshal(b, &farm) != nil || farm.Egress != nil {
			t.Fatalf("PUT egress %q refused (%d) but the farm changed: %s (%v)", body, code, b, err)
		}
	})
}

// A subnet's own egress setting overrides its farm's, both ways, and its
// VMs' slices follow: given, taken back, and given again when the subnet
// drops its own setting; a VM made in or moved into the subnet gets what
// the subnet says.
func TestSubnetEgressOverridesTheFarmsAndItsVMsSlicesFollow(t *testing.T) {
	srv, s := apiServer(t)
	putNode(t, s, "h1", 1, 32768, 60999)
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"db"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"w","host":"h1"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/db/vms", `{"name":"d","host":"h1"}`, 201)
	slices := func() string {
		var out []string
		for _, vm := range []string{"web/vms/w", "db/vms/d"} {
			out = append(out, sliceOf(t, mustCall(t, srv, "GET", "/v1/farms/blue/subnets/"+vm, ``, 200)))
		}
		return strings.Join(out, " ")
	}

	// The farm's off; db's own on, with its own slice size.
	sub := mustCall(t, srv, "PUT", "/v1/farms/blue/subnets/db/egress", `{"enabled":true,"slice":64,"to":["192.0.2.0/24"]}`, 200)
	if e, _ := sub["egress"].(map[string]any); e == nil || e["slice"] != 64.0 || e["off"] != nil {
		t.Fatalf("db after its own egress on: %v", sub)
	}
	if got := slices(); got != "- 1024-1087" {
		t.Errorf("farm off, db on: slices %s, want - 1024-1087", got)
	}
	// The farm's on; db's own off now.
	mustCall(t, srv, "PUT", "/v1/farms/blue/egress", `{"enabled":true,"slice":100}`, 200)
	mustCall(t, srv, "PUT", "/v1/farms/blue/subnets/db/egress", `{"enabled":false}`, 200)
	if got := slices(); got != "1088-1187 -" {
		t.Errorf("farm on, db off: slices %s, want 1088-1187 -", got)
	}
	// A VM made in db gets none; one moved there loses its slice.
	if got := sliceOf(t, mustCall(t, srv, "POST", "/v1/farms/blue/subnets/db/vms", `{"name":"d2","host":"h1"}`, 201)); got != "-" {
		t.Errorf("d2 made in db: slice %s, want none", got)
	}
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"w2","host":"h1"}`, 201)
	if got := sliceOf(t, mustCall(t, srv, "PUT", "/v1/farms/blue/subnets/web/vms/w2/host", `{"host":"h1","subnet":"blue/db"}`, 200)); got != "-" {
		t.Errorf("w2 moved into db: slice %s, want none", got)
	}
	// A farm change leaves db's own setting be.
	mustCall(t, srv, "PUT", "/v1/farms/blue/egress", `{"enabled":true,"slice":200}`, 200)
	if got := slices(); got != "1024-1223 -" {
		t.Errorf("farm resized, db off: slices %s, want 1024-1223 -", got)
	}
	// db drops its own setting: the farm's applies.
	sub = mustCall(t, srv, "DELETE", "/v1/farms/blue/subnets/db/egress", ``, 200)
	if sub["egress"] != nil {
		t.Fatalf("db after dropping its own egress: %v", sub)
	}
	if got := slices(); got != "1024-1223 1224-1423" {
		t.Errorf("db as the farm: slices %s, want 1024-1223 1224-1423", got)
	}
	for _, c := range []struct{ path, body, want string }{
		{"/v1/farms/blue/subnets/db/egress", `{"enabled":false,"slice":64}`, "pass --egress to turn it on"},
		{"/v1/farms/blue/subnets/db/egress", `{"enabled":true,"slice":9}`, "slice of 9 ports: want 16..4096"},
		{"/v1/farms/blue/subnets/nope/egress", `{"enabled":true}`, "subnet blue/nope"},
	} {
		code, out := call(t, srv, "PUT", c.path, c.body)
		if code/100 != 4 || !strings.Contains(out["error"].(string), c.want) {
			t.Errorf("PUT %s %s: %d %v, want a 4xx naming %q", c.path, c.body, code, out, c.want)
		}
	}
}

// In a topology file, a subnet's egress overrides its farm's: false turns
// it off there, a mapping on with its own slice; a bad one names its line.
func TestTopologySubnetEgressOverridesTheFarms(t *testing.T) {
	c, s := newController()
	file := `name: t
hosts: [{name: h1}]
farms:
  - name: blue
    egress: {slice: "64"}
    subnets: [{name: web}, {name: db, egress: false}, {name: big, egress: {slice: "128"}}]
vms:
  - {name: w, host: h1, subnet: blue/web}
  - {name: d, host: h1, subnet: blue/db}
  - {name: b, host: h1, subnet: blue/big}
`
	if err := c.ApplyTopology(t.Context(), parse(t, file)); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for name, v := range vms(t, s) {
		got[name] = "-"
		if v.Egress != nil {
			got[name] = fmt.Sprintf("%d ports", v.Egress.Slice.Hi-v.Egress.Slice.Lo+1)
		}
	}
	if want := map[string]string{"w": "64 ports", "d": "-", "b": "128 ports"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("slices %v, want %v", got, want)
	}
	_, err := topology.Parse("t.yaml", []byte(strings.Replace(file, "egress: false", "egress: off", 1)))
	if err == nil || !strings.Contains(err.Error(), "t.yaml:6") || !strings.Contains(err.Error(), "subnet egress must be false") {
		t.Errorf("egress: off parsed as %v, want an error naming line 6 and what a subnet egress may be", err)
	}
}
