package controller

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/desired"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/limits"
	"github.com/onehop/onehop/internal/store"
)

func TestNewControllerHoldsAsManyVMsPerHostAsTheDatapath(t *testing.T) {
	if c, _ := newController(); c.maxVMsPerHost != limits.MaxVMsPerHost {
		t.Fatalf("a new controller holds %d VMs per host, want limits.MaxVMsPerHost (%d)", c.maxVMsPerHost, limits.MaxVMsPerHost)
	}
}

// A host's datapath holds limits.MaxVMsPerHost VMs (2 here). One more is
// refused when it is created or moved there, with a 409 naming the host;
// the host's other VMs stay in its desired state, and other hosts take VMs.
func TestAPIRefusesAVMOnAFullHostAndKeepsItsOtherVMs(t *testing.T) {
	c, s := newController()
	c.maxVMsPerHost = 2
	ctx := t.Context()
	for _, h := range []string{"h1", "h2"} {
		store.PutJSON(ctx, s, intent.HostsPrefix+h, intent.Host{Name: h})
		store.PutJSON(ctx, s, intent.NodesPrefix+h, intent.Node{Name: h, UplinkMAC: "aa:00:00:00:00:01"})
	}
	srv := httptest.NewServer(c.API())
	t.Cleanup(srv.Close)
	do := func(method, path, body string) (int, map[string]any) { return call(t, srv, method, path, body) }
	vms := "/v1/farms/blue/subnets/web/vms"
	runCases(t, do, []apiCase{
		{"POST", "/v1/farms", `{"name":"blue"}`, 201, "", ""},
		{"POST", "/v1/farms/blue/subnets", `{"name":"web"}`, 201, "", ""},
		{"POST", vms, `{"name":"a","host":"h1"}`, 201, "", ""},
		{"POST", vms, `{"name":"b","host":"h1"}`, 201, "", ""},
		{"POST", vms, `{"name":"c","host":"h1"}`, 409, "host", `host "h1" holds 2 VMs, as many as its datapath holds (2), 0 left`},
		{"POST", vms, `{"name":"c","host":"h2"}`, 201, "", ""},
		{"PUT", vms + "/c/host", `{"host":"h1"}`, 409, "host", `host "h1" holds 2 VMs`},
		{"PUT", vms + "/a/host", `{"host":"h1"}`, 200, "", ""},
	})
	if _, err := c.CompileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	var d1, d2 intent.Desired
	d1, _, _ = desired.Read(ctx, s, "h1")
	d2, _, _ = desired.Read(ctx, s, "h2")
	if len(d1.Local) != 2 || d1.Local[0].Name != "blue/web/a" || d1.Local[1].Name != "blue/web/b" {
		t.Errorf("h1 desired %+v, want a and b", d1.Local)
	}
	if len(d2.Local) != 1 || d2.Local[0].Name != "blue/web/c" {
		t.Errorf("h2 desired %+v, want c", d2.Local)
	}
	// Room made on h1 is room to use.
	runCases(t, do, []apiCase{
		{"PUT", vms + "/a/host", `{"host":"h2"}`, 200, "", ""},
		{"PUT", vms + "/c/host", `{"host":"h1"}`, 200, "", ""},
	})
}

func TestTopologyPuttingMoreVMsOnAHostThanItsDatapathHoldsIsRefused(t *testing.T) {
	c, _ := newController()
	c.maxVMsPerHost = 1
	err := c.ApplyTopology(t.Context(), parse(t, topo))
	if err == nil || !strings.Contains(err.Error(), `host "h2" would hold more VMs than its datapath holds (1)`) {
		t.Fatalf("err = %v, want h2 refused", err)
	}
}
