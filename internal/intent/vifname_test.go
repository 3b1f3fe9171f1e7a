package intent

import (
	"strings"
	"testing"
)

func TestVifNameStaysWithinIFNAMSIZ(t *testing.T) {
	if got := VifName("web1"); got != "vif-web1" {
		t.Errorf("VifName(web1) = %q, want vif-web1 (short names unchanged)", got)
	}
	if got := VifName("abcdefghijk"); got != "vif-abcdefghijk" {
		t.Errorf("an 11-letter name (the longest a VM name is today) became %q", got)
	}
	a, b := VifName("container-0123456789abcdef"), VifName("container-0123456789abcdeg")
	for _, n := range []string{a, b} {
		if len(n) > MaxIfname || !strings.HasPrefix(n, VifPrefix) || CheckInterface("interface", n) != nil {
			t.Errorf("default interface %q: not a valid name within %d bytes starting %s", n, MaxIfname, VifPrefix)
		}
	}
	if a == b {
		t.Errorf("two long names sharing a beginning got one interface %q", a)
	}
	if VifName("container-0123456789abcdef") != a {
		t.Error("VifName is not stable")
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
