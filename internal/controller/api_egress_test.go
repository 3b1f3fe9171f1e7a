package controller

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
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
