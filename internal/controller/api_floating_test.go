package controller

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

func floatingOfVM(t *testing.T, vm map[string]any) string {
	t.Helper()
	f, _ := vm["floating"].(string)
	return f
}

// The pool: addresses on a host's fabric subnet, outside the tenant space
// and no host's own; one VM each (409 naming the holder); a VM's record
// carries its address, so a move takes it along and a delete frees it.
func TestFloatingAddressesAttachDetachAndFollowTheirVM(t *testing.T) {
	srv, s := apiServer(t)
	putHost(t, s, "h2")
	putNode(t, s, "h1", 1, 32768, 60999) // 192.168.100.10/24
	putNode(t, s, "h2", 1, 32768, 60999)
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"web"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"a","host":"h1"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"b","host":"h1"}`, 201)

	for _, c := range []struct {
		body string
		code int
		want string
	}{
		{`{"address":"nope"}`, 400, `"nope": want an IPv4 address on the fabric`},
		{`{"address":"2001:db8::1"}`, 400, "want an IPv4 address"},
		{`{"address":"10.1.1.9"}`, 400, "10.1.1.9 is in the tenant space 10.0.0.0/8"},
		{`{"address":"192.168.100.10"}`, 409, "192.168.100.10 is host h1's own address"},
		{`{"address":"198.51.100.7"}`, 400, "198.51.100.7 is on no host's fabric subnet (h1 192.168.100.0/24, h2 192.168.100.0/24)"},
		{`{"adress":"192.168.100.50"}`, 400, "adress"},
	} {
		code, out := call(t, srv, "POST", "/v1/floating", c.body)
		if code != c.code || !strings.Contains(out["error"].(string), c.want) {
			t.Errorf("create %s: %d %v, want %d naming %q", c.body, code, out, c.code, c.want)
		}
	}
	mustCall(t, srv, "POST", "/v1/floating", `{"address":"192.168.100.50"}`, 201)
	mustCall(t, srv, "POST", "/v1/floating", `{"address":"192.168.100.51"}`, 201)
	if code, out := call(t, srv, "POST", "/v1/floating", `{"address":"192.168.100.50"}`); code != 409 || !strings.Contains(out["error"].(string), "192.168.100.50 is in the pool: already exists") {
		t.Errorf("create twice: %d %v", code, out)
	}

	// Attach, and its errors.
	for _, c := range []struct {
		path, body string
		code       int
		want       string
	}{
		{"/v1/floating/192.168.100.99/vm", `{"vm":"blue/web/a"}`, 404, "floating address 192.168.100.99 is not in the pool"},
		{"/v1/floating/192.168.100.50/vm", `{"vm":"blue/web"}`, 400, `"blue/web": want FARM/SUBNET/VM`},
		{"/v1/floating/192.168.100.50/vm", `{"vm":"blue/web/zz"}`, 404, "vm blue/web/zz"},
		{"/v1/floating/10.1.1.2/vm", `{"vm":"blue/web/a"}`, 400, "is in the tenant space"},
	} {
		code, out := call(t, srv, "PUT", c.path, c.body)
		if code != c.code || !strings.Contains(out["error"].(string), c.want) {
			t.Errorf("attach %s %s: %d %v, want %d naming %q", c.path, c.body, code, out, c.code, c.want)
		}
	}
	f := mustCall(t, srv, "PUT", "/v1/floating/192.168.100.50/vm", `{"vm":"blue/web/a"}`, 200)
	if f["vm"] != "blue/web/a" || f["host"] != "h1" {
		t.Errorf("attach answered %v", f)
	}
	mustCall(t, srv, "PUT", "/v1/floating/192.168.100.50/vm", `{"vm":"blue/web/a"}`, 200) // again: no change
	if got := floatingOfVM(t, mustCall(t, srv, "GET", "/v1/farms/blue/subnets/web/vms/a", ``, 200)); got != "192.168.100.50" {
		t.Errorf("a's floating address %q", got)
	}
	if code, out := call(t, srv, "PUT", "/v1/floating/192.168.100.50/vm", `{"vm":"blue/web/b"}`); code != 409 || !strings.Contains(out["error"].(string), "is attached to vm blue/web/a") {
		t.Errorf("attach a held address to b: %d %v, want 409 naming a", code, out)
	}
	if code, out := call(t, srv, "PUT", "/v1/floating/192.168.100.51/vm", `{"vm":"blue/web/a"}`); code != 409 || !strings.Contains(out["error"].(string), "vm blue/web/a has floating address 192.168.100.50 already") {
		t.Errorf("a second address for a: %d %v, want 409", code, out)
	}
	if code, out := call(t, srv, "DELETE", "/v1/floating/192.168.100.50", ``); code != 409 || !strings.Contains(out["error"].(string), "attached to vm blue/web/a") {
		t.Errorf("delete a held address: %d %v, want 409 naming a", code, out)
	}

	// The desired state: h1 holds a's address; after a move, h2 does.
	c := New(s, slog.New(slog.DiscardHandler))
	local := func(host string) map[string]intent.LocalEndpoint {
		t.Helper()
		if _, err := c.CompileOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
		return desiredLocal(t, s, host)
	}
	if l := local("h1")["blue/web/a"]; l.Floating != "192.168.100.50" {
		t.Errorf("h1's endpoint for a: %+v, want its floating address", l)
	}
	mustCall(t, srv, "PUT", "/v1/farms/blue/subnets/web/vms/a/host", `{"host":"h2"}`, 200)
	if l := local("h2")["blue/web/a"]; l.Floating != "192.168.100.50" {
		t.Errorf("h2's endpoint for a after the move: %+v, want its floating address", l)
	}
	if l, ok := local("h1")["blue/web/a"]; ok {
		t.Errorf("h1 still serves a: %+v", l)
	}
	list := listFloating(t, srv)
	if len(list) != 2 || list[0].VM != "blue/web/a" || list[0].Host != "h2" || list[1].VM != "" {
		t.Errorf("list after the move: %+v", list)
	}

	// Detach frees it for b; a second detach is a 409.
	mustCall(t, srv, "DELETE", "/v1/floating/192.168.100.50/vm", ``, 200)
	if got := floatingOfVM(t, mustCall(t, srv, "GET", "/v1/farms/blue/subnets/web/vms/a", ``, 200)); got != "" {
		t.Errorf("a keeps %q after the detach", got)
	}
	if code, out := call(t, srv, "DELETE", "/v1/floating/192.168.100.50/vm", ``); code != 409 || !strings.Contains(out["error"].(string), "is not attached to any vm") {
		t.Errorf("detach twice: %d %v", code, out)
	}
	mustCall(t, srv, "PUT", "/v1/floating/192.168.100.50/vm", `{"vm":"blue/web/b"}`, 200)

	// Deleting b frees the address: c may take it, and the pool lists it as c's.
	mustCall(t, srv, "DELETE", "/v1/farms/blue/subnets/web/vms/b", ``, 204)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"c","host":"h1"}`, 201)
	mustCall(t, srv, "PUT", "/v1/floating/192.168.100.50/vm", `{"vm":"blue/web/c"}`, 200)
	mustCall(t, srv, "DELETE", "/v1/floating/192.168.100.50/vm", ``, 200)
	mustCall(t, srv, "DELETE", "/v1/floating/192.168.100.50", ``, 204)
	mustCall(t, srv, "DELETE", "/v1/floating/192.168.100.50", ``, 404)
	if list := listFloating(t, srv); len(list) != 1 || list[0].Address != "192.168.100.51" {
		t.Errorf("pool after the delete: %+v", list)
	}
}

func listFloating(t *testing.T, srv *httptest.Server) []intent.FloatingAddress {
	t.Helper()
	resp, err := http.Get(srv.URL + "/v1/floating")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []intent.FloatingAddress
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("list the pool: %d %v", resp.StatusCode, err)
	}
	return out
}

// The pool is the operator's: a tenant may not list it, create, delete,
// attach (even to its own VM) or detach.
func TestFloatingIsTheOperatorsOnly(t *testing.T) {
	e := newTenantEnv(t)
	n := intent.Node{Name: "h1", Uplinks: []intent.NodeUplink{{Index: 0, IP: "192.168.100.10", Bits: 24}}}
	b, _ := json.Marshal(n)
	if err := e.s.Put(t.Context(), intent.NodesPrefix+"h1", b); err != nil {
		t.Fatal(err)
	}
	e.must(t, "blue", "GET", "/v1/floating", ``, 403)
	e.must(t, "blue", "POST", "/v1/floating", `{"address":"192.168.100.50"}`, 403)
	e.must(t, "admin", "POST", "/v1/floating", `{"address":"192.168.100.50"}`, 201)
	e.must(t, "blue", "PUT", "/v1/floating/192.168.100.50/vm", `{"vm":"blue/web/web1"}`, 403)
	e.must(t, "admin", "PUT", "/v1/floating/192.168.100.50/vm", `{"vm":"blue/web/web1"}`, 200)
	e.must(t, "blue", "DELETE", "/v1/floating/192.168.100.50/vm", ``, 403)
	e.must(t, "blue", "DELETE", "/v1/floating/192.168.100.50", ``, 403)
	// The tenant sees its VM's address on the VM.
	var v intent.VM
	if err := json.Unmarshal(e.must(t, "blue", "GET", "/v1/farms/blue/subnets/web/vms/web1", ``, 200), &v); err != nil || v.Floating != "192.168.100.50" {
		t.Errorf("blue's web1: %+v (%v)", v, err)
	}
}

// FuzzAPIFloatingBody: any body for creating a pool address or attaching
// one is a 2xx or a 4xx naming its field, never a 5xx (fuzzAPIWith checks
// both), and a refused one leaves the pool and the VMs as they were.
func FuzzAPIFloatingBody(f *testing.F) {
	seedBodies(f, `{"address":"192.168.100.51"}`, `{"address":"192.168.100.50"}`, `{"address":"10.1.1.2"}`, `{"address":"x"}`,
		`{"address":""}`, `{"vm":"blue/web/web1"}`, `{"vm":"blue/web"}`, `{"vm":"red/web/nope"}`, `{"vm":7}`, `{`, ``, `null`, `[]`)
	send := fuzzAPIWith(f, fuzzTopo, func(t *testing.T, c *Controller, s *store.Memory) {
		for _, h := range []string{"h1", "h2"} {
			putNode(t, s, h, 1, 32768, 60999)
		}
		if _, err := c.CreateFloating(t.Context(), "192.168.100.50"); err != nil {
			t.Fatal(err)
		}
	})
	f.Fuzz(func(t *testing.T, body string) {
		for _, op := range []struct{ method, path string }{{"POST", "/v1/floating"}, {"PUT", "/v1/floating/192.168.100.50/vm"}} {
			s, code := send(t, op.method, op.path, body)
			if code < 300 {
				continue
			}
			pool, _, err := s.List(t.Context(), intent.FloatingPrefix)
			want := `{"address":"192.168.100.50"}`
			if err != nil || len(pool) != 1 || string(pool[intent.FloatingPrefix+"192.168.100.50"]) != want {
				t.Fatalf("%s %s %q refused (%d) but the pool changed: %s (%v)", op.method, op.path, body, code, pool, err)
			}
			vms, _, err := store.ListJSON[intent.VM](t.Context(), s, intent.VMsPrefix)
			for _, v := range vms {
				if v.Floating != "" || err != nil {
					t.Fatalf("%s %s %q refused (%d) but vm %s holds %q (%v)", op.method, op.path, body, code, v.FullName(), v.Floating, err)
				}
			}
		}
	})
}
