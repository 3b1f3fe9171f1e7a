package topology

import (
	"fmt"
	"strings"
	"testing"
)

func TestPlanLineSetsTheCloudsPlanAndItsLimits(t *testing.T) {
	f, err := Parse("t.yaml", []byte("plan: 10.0.0.0/8:12/6/6\n"+good))
	if err != nil {
		t.Fatal(err)
	}
	if p := f.AddrPlan(); p.FarmBits != 12 || p.SubnetBits != 6 || p.VMBits != 6 {
		t.Fatalf("plan %v", p)
	}
	if f, err := Parse("t.yaml", []byte(good)); err != nil || !f.AddrPlan().IsDefault() {
		t.Fatalf("no plan line: %v, %v", f.AddrPlan(), err)
	}

	// 300 farms fit a 12-bit farm field, not the default's 8.
	var b strings.Builder
	b.WriteString("name: t\nhosts:\n  - name: h1\nfarms:\n")
	for i := 1; i <= 300; i++ {
		fmt.Fprintf(&b, "  - name: f%d\n    subnets:\n      - name: s\n", i)
	}
	if _, err := Parse("t.yaml", []byte("plan: 10.0.0.0/8:12/6/6\n"+b.String())); err != nil {
		t.Fatalf("300 farms in 12/6/6: %v", err)
	}
	_, err = Parse("t.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "300 farms; at most 255 fit in the address plan 10.0.0.0/8:8/8/8") {
		t.Fatalf("300 farms in the default plan: %v", err)
	}

	// 62 VMs do not fit a 6-bit subnet.
	b.Reset()
	b.WriteString("plan: 10.0.0.0/8:12/6/6\nhosts:\n  - name: h1\nfarms:\n  - name: blue\n    subnets:\n      - name: web\nvms:\n")
	for i := 1; i <= 62; i++ {
		fmt.Fprintf(&b, "  - name: v%d\n    host: h1\n    subnet: blue/web\n", i)
	}
	_, err = Parse("t.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), `subnet "blue/web" holds more than 61 VMs`) {
		t.Fatalf("62 VMs in a 6-bit subnet: %v", err)
	}
}

func TestPlanLineErrorsNameTheLineAndWhatIsWrong(t *testing.T) {
	_, err := Parse("t.yaml", []byte(good+"plan: 10.0.0.0/8:12/6/5\n"))
	if err == nil || !strings.Contains(err.Error(), "t.yaml:12: plan \"10.0.0.0/8:12/6/5\"") || !strings.Contains(err.Error(), "has 23 bits but prefix 10.0.0.0/8 leaves 24") {
		t.Fatalf("err = %v", err)
	}
	_, err = Parse("t.yaml", []byte("plan: 192.168.0.0/16:4/4/8\n"+good+"fabric: {cidr: 192.168.100.0/24}\n"))
	if err == nil || !strings.Contains(err.Error(), "outside the tenant space 192.168.0.0/16") {
		t.Fatalf("a fabric inside the plan's prefix: %v", err)
	}
}
