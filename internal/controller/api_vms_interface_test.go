package controller

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// A VM's interface: named or the default, checked as Linux checks an
// interface name, and never shared by two VMs of one host.
func TestAPIVMInterfaceIsCheckedAndNotShared(t *testing.T) {
	do, s := blueWithVM(t)
	putHost(t, s, "h2")
	vms := "/v1/farms/blue/subnets/web/vms"
	runCases(t, do, []apiCase{
		{"POST", vms, `{"name":"q1","host":"h1","interface":"tap/0"}`, 400, "interface", `interface "tap/0"`},
		{"POST", vms, `{"name":"q1","host":"h1","interface":"tap 0"}`, 400, "interface", "whitespace"},
		{"POST", vms, `{"name":"q1","host":"h1","interface":".."}`, 400, "interface", "not an interface name"},
		{"POST", vms, `{"name":"q1","host":"h1","interface":"abcdefghijklmnop"}`, 400, "interface", "at most 15 bytes"},
		{"POST", vms, `{"name":"q1","host":"h1","interface":"` + intent.VifName("blue", "web1") + `"}`, 409, "interface", "blue/web/web1"},
		{"POST", vms, `{"name":"q1","host":"h1","interface":"tap-q1"}`, 201, "", ""},
		{"POST", vms, `{"name":"q2","host":"h1","interface":"tap-q1"}`, 409, "interface", "tap-q1"},
		{"POST", vms, `{"name":"q3","host":"h1"}`, 201, "", ""},
		// The CNI attachment a container's VM is made for.
		{"POST", vms, `{"name":"c1","host":"h1","container":{"network":"","id":"abc","ifname":"eth0"}}`, 400, "container", "container.network: want 1 to 256 bytes"},
		{"POST", vms, `{"name":"c1","host":"h1","container":{"network":"n","id":"a b","ifname":"eth0"}}`, 400, "container", `container.id "a b": only letters`},
		{"POST", vms, `{"name":"c1","host":"h1","container":{"network":"n","id":"abc","ifname":"eth0/1"}}`, 400, "container", "container.ifname"},
		{"POST", vms, `{"name":"c1","host":"h1","container":{"network":"n","id":"abc","ifname":"eth0","x":1}}`, 400, "", "unknown field"},
		{"POST", vms, `{"name":"c1","host":"h1","container":{"network":"blue-web","id":"abc","ifname":"eth0"}}`, 201, "", ""},
	})
	if code, out := do("GET", vms+"/c1", ""); code != 200 || out["container"] == nil {
		t.Errorf("GET c1: %d %v, want its container", code, out)
	}
	// What the VM record says: the named interface, or the default.
	for body, want := range map[string]string{
		`{"name":"q4","host":"h2","interface":"tap-q1"}`: "tap-q1", // another host: free there
		`{"name":"q5","host":"h2"}`:                      intent.VifName("blue", "q5"),
	} {
		code, out := do("POST", vms, body)
		if code != 201 || out["interface"] != want {
			t.Errorf("POST %s: %d, interface %v, want 201 and %s", body, code, out["interface"], want)
		}
	}
}

// The interfaces in use are indexed by host (a create no longer scans the
// host's VMs): the index follows a VM that is deleted, moved to another
// host or to another subnet, and is rebuilt by a controller that starts
// on the same store; the conflict names the VM that holds the interface.
func TestVMInterfaceStaysTakenAndFreedAsItsVMComesAndGoes(t *testing.T) {
	ctx := t.Context()
	c, s := cloud(t, 3, 2, 30)
	taken := func(c *Controller, host, iface, holder string) {
		t.Helper()
		_, err := c.CreateVMWithInterface(ctx, "blue", "s0", "probe", host, iface)
		if err == nil {
			t.Fatalf("%s on %s was free, want it held by %s", iface, host, holder)
		}
		if !strings.Contains(err.Error(), "interface "+iface+" of host "+host+", vm "+holder) {
			t.Fatalf("%s on %s: %v, want a conflict naming %s", iface, host, err, holder)
		}
	}
	free := func(c *Controller, host, iface string) {
		t.Helper()
		if _, err := c.CreateVMWithInterface(ctx, "blue", "s0", "probe", host, iface); err != nil {
			t.Fatalf("%s on %s: %v, want it free", iface, host, err)
		}
		if err := c.DeleteVM(ctx, "blue", "s0", "probe"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.CreateVMWithInterface(ctx, "red", "s1", "q", "h1", "tap-q"); err != nil {
		t.Fatal(err)
	}
	taken(c, "h1", "tap-q", "red/s1/q")
	taken(c, "h0", intent.VifName("blue", "vm0"), "blue/s0/vm0") // the default name, of a VM of the cloud
	free(c, "h2", "tap-q")                                       // another host
	// A controller started on the same store knows it too.
	taken(New(s, slog.New(slog.DiscardHandler)), "h1", "tap-q", "red/s1/q")
	// Moved to another host: free where it was, taken where it is.
	if _, err := c.MoveVM(ctx, "red", "s1", "q", "h2", ""); err != nil {
		t.Fatal(err)
	}
	free(c, "h1", "tap-q")
	taken(c, "h2", "tap-q", "red/s1/q")
	// Moved to another subnet: held under its new name.
	if _, err := c.MoveVM(ctx, "red", "s1", "q", "h2", "red/s0"); err != nil {
		t.Fatal(err)
	}
	taken(c, "h2", "tap-q", "red/s0/q")
	// Deleted: free.
	if err := c.DeleteVM(ctx, "red", "s0", "q"); err != nil {
		t.Fatal(err)
	}
	free(c, "h2", "tap-q")
	// A move that keeps its own interface is no conflict with itself.
	if _, err := c.CreateVMWithInterface(ctx, "red", "s1", "q", "h1", "tap-q"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.MoveVM(ctx, "red", "s1", "q", "h1", "red/s0"); err != nil {
		t.Fatalf("a move within its host, to another subnet: %v", err)
	}
	taken(c, "h1", "tap-q", "red/s0/q")
}

// A cloud made before VM names were per farm has VMs on vif-NAME: they keep
// it (the record holds it, the desired state serves it, a move carries
// it), it stays theirs on their host, and red's web1 beside blue's gets its
// own derived interface.
func TestAStoredVMKeepsItsInterfaceWhenAnotherFarmTakesItsName(t *testing.T) {
	ctx := t.Context()
	c, s := cloud(t, 2, 1, 0)
	if _, err := c.CreateVMWithInterface(ctx, "blue", "s0", "web1", "h0", "vif-web1"); err != nil {
		t.Fatal(err)
	}
	red, err := c.CreateVM(ctx, "red", "s0", "web1", "h0")
	if err != nil {
		t.Fatalf("red/s0/web1 beside blue/s0/web1 (on vif-web1): %v", err)
	}
	if red.Interface != intent.VifName("red", "web1") {
		t.Errorf("red/s0/web1 on %s, want %s", red.Interface, intent.VifName("red", "web1"))
	}
	if _, err := c.CreateVMWithInterface(ctx, "red", "s0", "web2", "h0", "vif-web1"); err == nil || !strings.Contains(err.Error(), "vm blue/s0/web1") {
		t.Errorf("vif-web1 on h0 for red/s0/web2: %v, want it blue/s0/web1's", err)
	}
	if _, err := c.MoveVM(ctx, "blue", "s0", "web1", "h1", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CompileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	var l intent.LocalEndpoint
	if err := store.GetJSON(ctx, s, intent.DesiredVMKey("h1", "blue/s0/web1"), &l); err != nil || l.Interface != "vif-web1" {
		t.Errorf("h1's endpoint for blue/s0/web1: %+v (%v), want it on vif-web1", l, err)
	}
}
