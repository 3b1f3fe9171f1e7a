package controller

import (
	"net/url"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lease"
	"github.com/onehop/onehop/internal/store"
)

// FuzzAPISliverBody: whatever a client posts as a sliver, the API answers
// below 500 and every error names a field (fuzzAPI's promises); a refused
// sliver stored nothing, a created one is the only sliver, on slot 1, with
// leases that pass the check.
func FuzzAPISliverBody(f *testing.F) {
	seedBodies(f, `{"host":"h1","name":"s1","ports":"10000-10099"}`, `{"host":"h1","name":"s1","ports":"10000-10099,1:20000-20099"}`,
		`{"host":"h9","name":"s1","ports":"10000"}`, `{"host":"h1","name":"S1","ports":"10000"}`, `{"host":"h1","name":"s1","ports":"40000"}`,
		`{"host":"h1","name":"s1","ports":"0-70000"}`, `{"host":"h1","name":"s1","ports":""}`, `{"host":"h1","name":"s1"}`,
		`{"host":"h1","name":"s1","ports":10000}`, `{"host":"h1","name":"s1","ports":"1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"}`)
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, body string) {
		s, code := send(t, "POST", "/v1/slivers", body)
		stored, _, err := store.ListJSON[intent.Sliver](t.Context(), s, intent.SliversPrefix)
		if err != nil {
			t.Fatal(err)
		}
		if code != 201 {
			if len(stored) != 0 {
				t.Fatalf("%q answered %d but stored %+v", body, code, stored)
			}
			return
		}
		if len(stored) != 1 || stored[0].Slot != 1 {
			t.Fatalf("%q created, stored %+v: want one sliver on slot 1", body, stored)
		}
		if err := lease.Check(stored[0].Leases); err != nil {
			t.Fatalf("%q stored leases CheckLeases refuses: %v", body, err)
		}
	})
}

// FuzzAPISliverPath: any host and sliver in the path of GET, PUT and
// DELETE, and any ?host= of the list, are answered below 500 with errors
// naming a field.
func FuzzAPISliverPath(f *testing.F) {
	for _, p := range [][2]string{{"h1", "s1"}, {"h9", "s1"}, {"h1", ""}, {"", "s1"}, {"h1", "s1/x"}, {"..", "s1"}, {"h1", "%2F"}} {
		f.Add(p[0], p[1])
	}
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, host, name string) {
		path := "/v1/slivers/" + url.PathEscape(host) + "/" + url.PathEscape(name)
		send(t, "GET", path, "")
		send(t, "PUT", path, `{"ports":"10000"}`)
		send(t, "DELETE", path, "")
		send(t, "GET", "/v1/slivers?host="+url.QueryEscape(host), "")
	})
}
