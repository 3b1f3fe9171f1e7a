package controller

import (
	"testing"
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
		{"POST", vms, `{"name":"q1","host":"h1","interface":"vif-web1"}`, 409, "interface", "blue/web/web1"},
		{"POST", vms, `{"name":"q1","host":"h1","interface":"tap-q1"}`, 201, "", ""},
		{"POST", vms, `{"name":"q2","host":"h1","interface":"tap-q1"}`, 409, "interface", "tap-q1"},
		{"POST", vms, `{"name":"q3","host":"h1"}`, 201, "", ""},
	})
	// What the VM record says: the named interface, or the default.
	for body, want := range map[string]string{
		`{"name":"q4","host":"h2","interface":"tap-q1"}`: "tap-q1", // another host: free there
		`{"name":"q5","host":"h2"}`:                      "vif-q5",
	} {
		code, out := do("POST", vms, body)
		if code != 201 || out["interface"] != want {
			t.Errorf("POST %s: %d, interface %v, want 201 and %s", body, code, out["interface"], want)
		}
	}
}
