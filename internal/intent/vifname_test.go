package intent

import (
	"net/netip"
	"strings"
	"testing"
)

func TestVifNameStaysWithinIFNAMSIZ(t *testing.T) {
	for _, c := range []struct{ farm, vm, begins string }{
		{"blue", "web1", "vif-web1-"},
		{"blue", "abcdefghijk", "vif-abcde-"}, // the longest a VM name is in a topology
		{"a-farm-name-of-thirty-two-chars", "container-0123456789abcdef", "vif-conta-"},
	} {
		n := VifName(c.farm, c.vm)
		if len(n) > MaxIfname || !strings.HasPrefix(n, c.begins) || CheckInterface("interface", n) != nil {
			t.Errorf("VifName(%s, %s) = %q: want a valid name within %d bytes beginning %s", c.farm, c.vm, n, MaxIfname, c.begins)
		}
		if VifName(c.farm, c.vm) != n {
			t.Errorf("VifName(%s, %s) is not stable", c.farm, c.vm)
		}
	}
	if a, b := VifName("blue", "container-0123456789abcdef"), VifName("blue", "container-0123456789abcdeg"); a == b {
		t.Errorf("two long names sharing a beginning got one interface %q", a)
	}
}

// Names are the tenant's: blue/web1 and red/web1 may share a host, so the
// farm is part of the default interface's name.
func TestVifNameOfOneNameInTwoFarmsDiffers(t *testing.T) {
	blue, red := VifName("blue", "web1"), VifName("red", "web1")
	if blue == red {
		t.Fatalf("blue/web1 and red/web1 both get %s", blue)
	}
	// Not a concatenation a farm and VM name could forge: blue-x/web1 is
	// not blue/x-web1.
	if VifName("blue-x", "web1") == VifName("blue", "x-web1") {
		t.Errorf("blue-x/web1 and blue/x-web1 share %s", VifName("blue", "x-web1"))
	}
	if v := NewVM("red", "web", "web1", "h1", netip.MustParseAddr("10.2.1.2")); v.Interface != red {
		t.Errorf("NewVM(red/web/web1).Interface = %q, want VifName's %q", v.Interface, red)
	}
}

func TestCheckInterfaceNamesTheField(t *testing.T) {
	for _, ok := range []string{"tap0", "vif-web1", "vnet12", "a", "abcdefghijklmno", "tap.db-3_x"} {
		if err := CheckInterface("interface", ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "abcdefghijklmnop", "tap/0", "tap 0", "tap\t0", "tap:0", "tap\n"} {
		err := CheckInterface("--interface", bad)
		if err == nil || !strings.HasPrefix(err.Error(), "--interface") {
			t.Errorf("%q: error %v, want one naming --interface", bad, err)
		}
	}
}
