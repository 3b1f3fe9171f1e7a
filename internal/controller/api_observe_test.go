package controller

import (
	"errors"
	"testing"
)

// A tenant's stream carries its own farm's events whatever it asks; naming
// another farm, or another farm's VM, is refused (403) before any host is
// asked to publish.
func TestATenantObservesItsOwnFarmOnly(t *testing.T) {
	e := newTenantEnv(t)
	blue, err := e.c.getFarm(t.Context(), "blue")
	if err != nil {
		t.Fatal(err)
	}
	asBlue := WithIdentity(t.Context(), Identity{Farm: "blue", Via: "tenant-token"})
	f, err := e.c.observeFilter(asBlue, "", "", "", "")
	if err != nil || f.Farm != uint32(blue.ID) {
		t.Fatalf("blue's stream without --farm: %+v, %v; want farm %d", f, err, blue.ID)
	}
	f, err = e.c.observeFilter(asBlue, "", "blue/web/web1", "", "spoofed_ip")
	if err != nil || f.Farm != uint32(blue.ID) || !f.Addr.IsValid() || f.Reason != "spoofed_ip" {
		t.Fatalf("blue's stream of web1: %+v, %v", f, err)
	}
	for _, c := range []struct{ farm, vm string }{{"red", ""}, {"", "red/web/rweb1"}} {
		if _, err := e.c.observeFilter(asBlue, c.farm, c.vm, "", ""); !errors.Is(err, ErrForbidden) {
			t.Errorf("blue asking for farm %q vm %q: %v, want permission denied", c.farm, c.vm, err)
		}
	}
	// Over HTTP too: the 403 comes before the stream.
	if code, out := e.call(t, "blue", "GET", "/v1/observe?farm=red", ""); code != 403 {
		t.Errorf("blue: GET /v1/observe?farm=red: %d %s, want 403", code, out)
	}
	// The admin may watch any farm, or all (0).
	f, err = e.c.observeFilter(t.Context(), "", "", "", "")
	if err != nil || f.Farm != 0 {
		t.Errorf("the admin's stream: %+v, %v; want every farm", f, err)
	}
	if _, err := e.c.observeFilter(t.Context(), "", "", "nosuchhost", ""); err == nil {
		t.Errorf("a stream of a host that has no agent: no error")
	}
}
