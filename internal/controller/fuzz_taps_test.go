package controller

import (
	"net/url"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/tappolicy"
)

// FuzzAPITapBody: whatever a client posts as a TAP policy, the API answers
// below 500 and every error names a field (fuzzAPI's promises); a refused
// policy stored nothing, a created one is the only one, on id 1, passes
// the syntax check, names its VMs by name, and compiles to rules.
func FuzzAPITapBody(f *testing.F) {
	seedBodies(f, `{"name":"t","sender":"blue/web/web1","receiver":"any","monitor":"blue/db/db1"}`,
		`{"name":"t","sender":"10.1.1.2","receiver":"02:00:0a:01:01:03","monitor":"10.1.2.2","proto":6,"dportLo":80,"dportHi":80,"bothDirections":true}`,
		`{"name":"t","sender":"blue/web","receiver":"any","monitor":"blue/db/db1","vlan":257}`,
		`{"name":"t","sender":"red/web","receiver":"any","monitor":"blue/db/db1","crossFarm":true}`,
		`{"name":"t","sender":"any","receiver":"any","monitor":"blue/db/db1","sportLo":9,"sportHi":1,"proto":1}`,
		`{"name":"t","sender":"any","receiver":"any","monitor":"blue/db","id":3}`, `{"name":"t"}`, `{}`, `{"name":"t","vlan":-1}`)
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, body string) {
		s, code := send(t, "POST", "/v1/taps", body)
		stored, _, err := store.ListJSON[intent.TapPolicy](t.Context(), s, intent.TapsPrefix)
		if err != nil {
			t.Fatal(err)
		}
		if code != 201 {
			if len(stored) != 0 {
				t.Fatalf("%q answered %d but stored %+v", body, code, stored)
			}
			return
		}
		if len(stored) != 1 || stored[0].ID != 1 {
			t.Fatalf("%q created, stored %+v: want one tap, id 1", body, stored)
		}
		p := stored[0]
		if err := tappolicy.Check(p); err != nil {
			t.Fatalf("%q stored a tap Check refuses: %v", body, err)
		}
		for _, ref := range []string{p.Sender, p.Receiver, p.Monitor} {
			if r, _ := tappolicy.ParseRef(ref); r.Kind == tappolicy.KindIP || r.Kind == tappolicy.KindMAC {
				t.Fatalf("%q stored %q by address, not by name", body, ref)
			}
		}
		w, err := New(s, quietLog()).tapWorld(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Rules(p); err != nil {
			t.Fatalf("%q stored a tap that compiles to nothing: %v", body, err)
		}
	})
}

// FuzzAPITapPath: any name in the path of GET, PUT and DELETE is answered
// below 500 with errors naming a field.
func FuzzAPITapPath(f *testing.F) {
	for _, n := range []string{"t", "", "T", "a/b", "..", "%2F", "averyveryveryveryveryverylongname-x"} {
		f.Add(n)
	}
	send := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, name string) {
		path := "/v1/taps/" + url.PathEscape(name)
		send(t, "GET", path, "")
		send(t, "PUT", path, `{"sender":"any","receiver":"any","monitor":"blue/db/db1"}`)
		send(t, "DELETE", path, "")
	})
}
