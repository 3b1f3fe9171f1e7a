package controller

import (
	"maps"
	"net/url"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// The GETs and DELETEs of farms, subnets, VMs and hosts take their input
// from the path and the cascade query: whatever a client puts there is
// answered below 500 with errors naming a field (fuzzAPI's promises); a
// delete that is refused changes nothing, and one that succeeds leaves no
// key naming what it deleted.

// storeKeys is every key of s under intent.Root, with its value.
func storeKeys(t *testing.T, s *store.Memory) map[string]string {
	t.Helper()
	kvs, _, err := s.List(t.Context(), intent.Root)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string, len(kvs))
	for k, v := range kvs {
		out[k] = string(v)
	}
	return out
}

// checkDelete holds a DELETE of what (FARM, FARM/SUBNET, FARM/SUBNET/VM or
// a host) to its promise: refused, the store is as before (a fresh
// fuzzTopo's, before); done, no key holds what in its name.
func checkDelete(t *testing.T, s *store.Memory, code int, before map[string]string, what, path string) {
	t.Helper()
	after := storeKeys(t, s)
	if code != 204 {
		if !maps.Equal(before, after) {
			t.Fatalf("DELETE %s answered %d but changed the store", path, code)
		}
		return
	}
	for k := range after {
		// A farm's delete leaves the revocation of its tenant's
		// certificates, which must outlive it (api_certs.go).
		if strings.HasPrefix(k, intent.TenantCertRevocationsPrefix+"farm/") {
			continue
		}
		if strings.Contains(k+"/", "/"+what+"/") {
			t.Fatalf("DELETE %s answered 204 but left %s", path, k)
		}
	}
}

func FuzzAPIFarmPath(f *testing.F) {
	for _, c := range [][2]string{{"blue", ""}, {"blue", "true"}, {"red", "true"}, {"red", ""}, {"nope", "true"},
		{"Blue", ""}, {"", "true"}, {"a/b", ""}, {"blue", "yes"}, {"..", "false"}} {
		f.Add(c[0], c[1])
	}
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, farm, cascade string) {
		s, _ := send(t, "GET", "/v1/farms", "")
		before := storeKeys(t, s)
		p := "/v1/farms/" + url.PathEscape(farm)
		for _, sub := range []string{"", "/subnets", "/vms"} {
			send(t, "GET", p+sub, "")
		}
		path := p + "?cascade=" + url.QueryEscape(cascade)
		s, code := send(t, "DELETE", path, "")
		checkDelete(t, s, code, before, farm, path)
	})
}

func FuzzAPISubnetPath(f *testing.F) {
	for _, c := range [][3]string{{"blue", "web", ""}, {"blue", "web", "true"}, {"blue", "db", "true"}, {"red", "web", ""},
		{"blue", "nope", ""}, {"nope", "web", ""}, {"blue", "Web", ""}, {"blue", "", "true"}, {"blue", "web", "1"}} {
		f.Add(c[0], c[1], c[2])
	}
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, farm, subnet, cascade string) {
		s, _ := send(t, "GET", "/v1/farms", "")
		before := storeKeys(t, s)
		p := "/v1/farms/" + url.PathEscape(farm) + "/subnets/" + url.PathEscape(subnet)
		send(t, "GET", p, "")
		path := p + "?cascade=" + url.QueryEscape(cascade)
		s, code := send(t, "DELETE", path, "")
		checkDelete(t, s, code, before, farm+"/"+subnet, path)
	})
}

func FuzzAPIVMPath(f *testing.F) {
	for _, c := range [][3]string{{"blue", "web", "web1"}, {"blue", "db", "db1"}, {"blue", "web", "nope"}, {"red", "web", "web1"},
		{"blue", "web", "Web1"}, {"blue", "web", ""}, {"blue", "web", "averyverylongname"}, {"blue", "web", "a%2Fb"}} {
		f.Add(c[0], c[1], c[2])
	}
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, farm, subnet, vm string) {
		s, _ := send(t, "GET", "/v1/farms", "")
		before := storeKeys(t, s)
		path := "/v1/farms/" + url.PathEscape(farm) + "/subnets/" + url.PathEscape(subnet) + "/vms/" + url.PathEscape(vm)
		send(t, "GET", path, "")
		s, code := send(t, "DELETE", path, "")
		checkDelete(t, s, code, before, farm+"/"+subnet+"/"+vm, path)
	})
}

func FuzzAPIHostPath(f *testing.F) {
	for _, c := range [][2]string{{"h1", ""}, {"h1", "cascade=true"}, {"h2", "drain=true"}, {"h9", ""}, {"H1", ""},
		{"h1", "cascade=maybe"}, {"h1", "drain=false&cascade=true"}, {"", ""}} {
		f.Add(c[0], c[1])
	}
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, host, query string) {
		s, _ := send(t, "GET", "/v1/farms", "")
		before := storeKeys(t, s)
		p := "/v1/hosts/" + url.PathEscape(host)
		send(t, "GET", p, "")
		path := p
		if v, err := url.ParseQuery(query); err == nil {
			path += "?" + v.Encode() // as a client's URL carries it
		}
		s, code := send(t, "DELETE", path, "")
		checkDelete(t, s, code, before, host, path)
	})
}
