package controller

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

func publishedOf(t *testing.T, vm map[string]any) string {
	t.Helper()
	ps, _ := vm["published"].([]any)
	var out []string
	for _, p := range ps {
		m := p.(map[string]any)
		out = append(out, m["proto"].(string)+" "+jsonNum(m["port"])+" on "+jsonNum(m["publicPort"]))
	}
	return strings.Join(out, ",")
}

func jsonNum(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// A published port is a lease of its host's address: refused with 409
// naming whoever holds it (a sliver, a slice, another publication, the
// ephemeral range), freed by unpublish and by its VM's delete, and taken
// along by a move to the same public port on the new host's address.
func TestPublishedPortsAreLeasesOfTheHostsAddress(t *testing.T) {
	srv, s := apiServer(t)
	putHost(t, s, "h2")
	putNode(t, s, "h1", 1, 32768, 60999)
	putNode(t, s, "h2", 1, 32768, 60999)
	mustCall(t, srv, "POST", "/v1/slivers", `{"host":"h1","name":"s1","ports":"9000-9099"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"a","host":"h1"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"b","host":"h1"}`, 201)
	mustCall(t, srv, "PUT", "/v1/farms/blue/egress", `{"enabled":true,"slice":100}`, 200) // a: 1024-1123, b: 1124-1223
	pub := "/v1/farms/blue/subnets/web/vms/"

	a := mustCall(t, srv, "POST", pub+"a/publications", `{"proto":"TCP","port":80,"publicPort":8080}`, 201)
	if got := publishedOf(t, a); got != "tcp 80 on 8080" {
		t.Fatalf("a published %q, want tcp 80 on 8080", got)
	}
	for _, c := range []struct {
		vm, body string
		code     int
		want     string
	}{
		{"b", `{"proto":"tcp","port":80,"publicPort":8080}`, 409, "overlap h1/publication tcp 80 on 8080 of blue/web/a's lease 8080"},
		{"b", `{"proto":"udp","port":53,"publicPort":8080}`, 409, "publication tcp 80 on 8080 of blue/web/a"},
		{"b", `{"proto":"tcp","port":22,"publicPort":9050}`, 409, "overlap h1/s1's lease 9000-9099"},
		{"b", `{"proto":"tcp","port":22,"publicPort":1100}`, 409, "overlap h1/egress slice of blue/web/a's lease 1024-1123"},
		{"b", `{"proto":"tcp","port":22,"publicPort":40000}`, 409, "ephemeral range 32768-60999"},
		{"b", `{"proto":"icmp","port":22}`, 400, `proto "icmp": want tcp or udp`},
		{"b", `{"proto":"tcp","port":0}`, 400, "port 0"},
		{"b", `{"proto":"tcp","port":70000}`, 400, "port"},
		{"nope", `{"proto":"tcp","port":22}`, 404, "vm blue/web/nope"},
	} {
		code, out := call(t, srv, "POST", pub+c.vm+"/publications", c.body)
		if code != c.code || !strings.Contains(out["error"].(string), c.want) {
			t.Errorf("%s %s: %d %v, want %d naming %q", c.vm, c.body, code, out, c.code, c.want)
		}
	}
	// A sliver may not lease a published port either.
	code, out := call(t, srv, "POST", "/v1/slivers", `{"host":"h1","name":"s2","ports":"8000-8100"}`)
	if code != 409 || !strings.Contains(out["error"].(string), "publication tcp 80 on 8080 of blue/web/a") {
		t.Errorf("sliver over a's published port: %d %v, want 409 naming it", code, out)
	}
	// The same port on another host is free: b there may have it.
	mustCall(t, srv, "PUT", pub+"b/host", `{"host":"h2"}`, 200)
	mustCall(t, srv, "POST", pub+"b/publications", `{"proto":"tcp","port":8443,"publicPort":8080}`, 201)
	// a cannot move to h2 while b holds its public port there: refused, a stays.
	code, out = call(t, srv, "PUT", pub+"a/host", `{"host":"h2"}`)
	if code != 409 || !strings.Contains(out["error"].(string), "publication tcp 8443 on 8080 of blue/web/b") {
		t.Errorf("a's move onto b's port: %d %v, want 409 naming b's publication", code, out)
	}
	if a := mustCall(t, srv, "GET", pub+"a", ``, 200); a["host"] != "h1" || publishedOf(t, a) != "tcp 80 on 8080" {
		t.Errorf("a after a refused move: %v", a)
	}
	// Unpublished, b's port is free; a moves, its publication along.
	mustCall(t, srv, "DELETE", pub+"b/publications/tcp/8443", ``, 200)
	code, _ = call(t, srv, "DELETE", pub+"b/publications/tcp/8443", ``)
	if code != 404 {
		t.Errorf("unpublish twice: %d, want 404", code)
	}
	moved := mustCall(t, srv, "PUT", pub+"a/host", `{"host":"h2"}`, 200)
	if got := publishedOf(t, moved); got != "tcp 80 on 8080" || moved["host"] != "h2" {
		t.Errorf("a moved: host %v published %q, want h2 with tcp 80 on 8080", moved["host"], got)
	}
	// Its old port on h1 is free again.
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"c","host":"h1"}`, 201)
	mustCall(t, srv, "POST", pub+"c/publications", `{"proto":"tcp","port":80,"publicPort":8080}`, 201)
	// Republished on another public port: moved, the old one freed.
	c2 := mustCall(t, srv, "POST", pub+"c/publications", `{"proto":"tcp","port":80,"publicPort":8081}`, 201)
	if got := publishedOf(t, c2); got != "tcp 80 on 8081" {
		t.Errorf("c republished: %q", got)
	}
	// A deleted VM frees its ports.
	mustCall(t, srv, "DELETE", pub+"a", ``, 204)
	mustCall(t, srv, "POST", pub+"b/publications", `{"proto":"tcp","port":80,"publicPort":8080}`, 201)

	// A slice goes round a published port: c publishes 1150 on h1, where
	// the next slice (100 ports from 1124, b's old one) would have taken it.
	mustCall(t, srv, "POST", pub+"c/publications", `{"proto":"udp","port":53,"publicPort":1150}`, 201)
	d := mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"d","host":"h1"}`, 201)
	if got := sliceOf(t, d); got != "1151-1250" {
		t.Errorf("d's slice %s, want 1151-1250 (round c's published 1150)", got)
	}
	// A move to another subnet on the same host keeps its public ports.
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"db"}`, 201)
	c3 := mustCall(t, srv, "PUT", pub+"c/host", `{"host":"h1","subnet":"blue/db"}`, 200)
	if got := publishedOf(t, c3); got != "udp 53 on 1150,tcp 80 on 8081" {
		t.Errorf("c moved to blue/db: published %q, want both its publications", got)
	}
}

// A tenant publishes its own farm's VMs only, from port 1024 up; the
// operator anywhere.
func TestPublishingIsTheFarmsOwnAndLowPortsTheOperators(t *testing.T) {
	e := newTenantEnv(t)
	e.must(t, "blue", "POST", "/v1/farms/blue/subnets/web/vms/web1/publications", `{"proto":"tcp","port":80,"publicPort":8080}`, 201)
	code, out := e.call(t, "red", "POST", "/v1/farms/blue/subnets/web/vms/web1/publications", `{"proto":"tcp","port":22,"publicPort":2222}`)
	if code != http.StatusForbidden {
		t.Errorf("red publishing blue's vm: %d %s, want 403", code, out)
	}
	code, out = e.call(t, "red", "DELETE", "/v1/farms/blue/subnets/web/vms/web1/publications/tcp/80", ``)
	if code != http.StatusForbidden {
		t.Errorf("red unpublishing blue's vm: %d %s, want 403", code, out)
	}
	code, out = e.call(t, "blue", "POST", "/v1/farms/blue/subnets/web/vms/web1/publications", `{"proto":"tcp","port":443}`)
	if code != http.StatusForbidden || !strings.Contains(string(out), "public port 443 is below 1024") {
		t.Errorf("blue on public port 443: %d %s, want 403 naming it", code, out)
	}
	e.must(t, "admin", "POST", "/v1/farms/blue/subnets/web/vms/web1/publications", `{"proto":"tcp","port":443}`, 201)
	e.must(t, "blue", "DELETE", "/v1/farms/blue/subnets/web/vms/web1/publications/tcp/443", ``, 200)
}

// FuzzAPIPublishBody: any body for a publication is a 201 or a 4xx naming
// its field, never a 5xx, and a refused one leaves the VM unpublished.
func FuzzAPIPublishBody(f *testing.F) {
	seedBodies(f, `{"proto":"tcp","port":80}`, `{"proto":"udp","port":53,"publicPort":5353}`, `{"proto":"tcp","port":80,"publicPort":40000}`,
		`{"proto":"icmp","port":1}`, `{"proto":"tcp"}`, `{"proto":"tcp","port":-1}`, `{"port":"80"}`, `{`, ``, `null`)
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, body string) {
		s, code := send(t, "POST", "/v1/farms/blue/subnets/web/vms/web1/publications", body)
		if code == http.StatusCreated {
			return
		}
		b, err := s.Get(t.Context(), intent.VMKey("blue", "web", "web1"))
		var v intent.VM
		if err != nil || json.Unmarshal(b, &v) != nil || len(v.Published) != 0 {
			t.Fatalf("publish %q refused (%d) but the vm changed: %s (%v)", body, code, b, err)
		}
	})
}
