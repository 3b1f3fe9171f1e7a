package addrplan

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
)

func TestDefaultPlanIsTenFSH(t *testing.T) {
	p := Default()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := p.Address(1, 2, 3); got != netip.MustParseAddr("10.1.2.3") {
		t.Fatalf("Address(1, 2, 3) = %v, want 10.1.2.3", got)
	}
	if got := p.Gateway(7, 9); got != netip.MustParseAddr("10.7.9.1") {
		t.Fatalf("Gateway = %v", got)
	}
	if got := p.Broadcast(7, 9); got != netip.MustParseAddr("10.7.9.255") {
		t.Fatalf("Broadcast = %v", got)
	}
	if got := p.SubnetPrefix(7, 9); got != netip.MustParsePrefix("10.7.9.0/24") {
		t.Fatalf("SubnetPrefix = %v", got)
	}
	if p.MaxFarms() != 255 || p.MaxSubnets() != 255 || p.MaxVMs() != 253 || p.SubnetMask() != 0xffffff00 {
		t.Fatalf("default holds %d farms, %d subnets, %d VMs, mask %x", p.MaxFarms(), p.MaxSubnets(), p.MaxVMs(), p.SubnetMask())
	}
	if got := ScopeMAC(4, 5).String(); got != "03:00:0a:04:05:00" {
		t.Fatalf("the default's scope MAC changed: %s, want 03:00:0a:04:05:00", got)
	}
	if p.String() != "10.0.0.0/8:8/8/8" {
		t.Fatalf("String = %s", p)
	}
}

func TestTwelveSixSixHoldsFarm300(t *testing.T) {
	p := MustParse("10.0.0.0/8:12/6/6")
	if p.MaxFarms() != 4095 || p.MaxSubnets() != 63 || p.MaxVMs() != 61 {
		t.Fatalf("12/6/6 holds %d farms, %d subnets, %d VMs; want 4095, 63, 61", p.MaxFarms(), p.MaxSubnets(), p.MaxVMs())
	}
	a := p.Address(300, 5, 2)
	// 300<<12 | 5<<6 | 2 = 0x12c142: 10.18.193.66.
	if a != netip.MustParseAddr("10.18.193.66") {
		t.Fatalf("Address(300, 5, 2) = %v, want 10.18.193.66", a)
	}
	f, s, h, ok := p.Split(a)
	if !ok || f != 300 || s != 5 || h != 2 {
		t.Fatalf("Split(%v) = %d %d %d %v", a, f, s, h, ok)
	}
	if g := p.GatewayOf(a); g != netip.MustParseAddr("10.18.193.65") {
		t.Fatalf("gateway of %v = %v", a, g)
	}
	if b := p.Broadcast(300, 5); b != netip.MustParseAddr("10.18.193.127") {
		t.Fatalf("broadcast = %v", b)
	}
	if sp := p.SubnetPrefix(300, 5); sp != netip.MustParsePrefix("10.18.193.64/26") {
		t.Fatalf("subnet prefix = %v", sp)
	}
	if k := p.Key(300, 5, 0); k != netip.MustParseAddr("0.18.193.64") {
		t.Fatalf("segment key = %v", k)
	}
	mac := ScopeMAC(300, 5)
	if mac.String() != "03:01:0a:2c:05:00" {
		t.Fatalf("scope MAC of 300/5 = %s", mac)
	}
	if f, s, ok := ParseScopeMAC(mac); !ok || f != 300 || s != 5 {
		t.Fatalf("ParseScopeMAC(%s) = %d %d %v", mac, f, s, ok)
	}
	if _, _, _, ok := p.Split(netip.MustParseAddr("192.168.1.1")); ok {
		t.Fatal("an address outside the prefix split")
	}
}

func TestEveryIDRoundTripsInAWidePlan(t *testing.T) {
	p := MustParse("172.16.0.0/12:10/4/6")
	for f := uint16(0); f < 1<<10; f += 37 {
		for s := uint16(0); s < 1<<4; s++ {
			for _, h := range []uint32{0, 1, 2, 62, 63} {
				a := p.Address(f, s, h)
				if !p.Contains(a) {
					t.Fatalf("%d/%d/%d: %v outside %v", f, s, h, a, p.Prefix)
				}
				gf, gs, gh, ok := p.Split(a)
				if !ok || gf != f || gs != s || gh != h {
					t.Fatalf("%d/%d/%d -> %v -> %d/%d/%d", f, s, h, a, gf, gs, gh)
				}
			}
		}
	}
	if f, s, ok := ParseScopeMAC(net.HardwareAddr{0x02, 0, 0x0a, 1, 2, 3}); ok {
		t.Fatalf("a unicast MAC parsed as scope %d/%d", f, s)
	}
}

func TestParseRefusesWhatCannotWorkAndSaysWhat(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"10.0.0.0/8:8/8/7", "has 23 bits but prefix 10.0.0.0/8 leaves 24"},
		{"10.0.0.0/8:8/15/1", "vm bits 1: want at least 2"},
		{"0.0.0.0/4:17/9/2", "farm bits 17: want 1 to 16"},
		{"10.0.0.0/8:0/16/8", "farm bits 0"},
		{"10.0.0.0/8:8/0/16", "subnet bits 0"},
		{"10.0.0.0/8:4/17/3", "subnet bits 17"},
		{"10.1.0.0/8:8/8/8", "has bits set past its length"},
		{"fd00::/8:8/8/8", "not an IPv4 prefix"},
		{"nonsense:8/8/8", `prefix "nonsense"`},
		{"10.0.0.0/8:8/8", "not farm/subnet/vm bits"},
		{"10.0.0.0/8:a/8/8", `farm bits "a"`},
		{"0.0.0.0/0:16/8/8", "whole address space"},
	} {
		_, err := Parse(c.in)
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v, want an error saying %q", c.in, err, c.want)
		}
	}
	if p, err := Parse("12/6/6"); err != nil || p.Prefix != netip.MustParsePrefix("10.0.0.0/8") {
		t.Fatalf("a split alone is on the default prefix: %v, %v", p, err)
	}
}

func TestSetRefusesAnInvalidPlanAndCurrentFollowsSet(t *testing.T) {
	t.Cleanup(func() { Set(Default()) })
	if err := Set(Plan{}); err == nil {
		t.Fatal("Set took the zero plan")
	}
	if !Current().IsDefault() {
		t.Fatalf("a refused plan changed Current: %v", Current())
	}
	p := MustParse("10.0.0.0/8:12/6/6")
	if err := Set(p); err != nil || Current() != p {
		t.Fatalf("Set(%v): %v, Current %v", p, err, Current())
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"10.0.0.0/8:8/8/8", "10.0.0.0/8:12/6/6", "12/6/6", "172.16.0.0/12:4/4/12", ":", "/8:1/1/1", "10.0.0.0/8:-1/9/24"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse(%q): error %v does not wrap ErrInvalid", s, err)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("Parse(%q) gave a plan Validate refuses: %v", s, err)
		}
		q, err := Parse(p.String())
		if err != nil || q != p {
			t.Fatalf("Parse(%q) = %v; its String %q parses to %v, %v", s, p, p.String(), q, err)
		}
		// The highest ids round-trip and stay inside the prefix.
		a := p.Address(uint16(p.MaxFarms()), uint16(p.MaxSubnets()), p.MaxHost())
		f, sn, h, ok := p.Split(a)
		if !ok || int(f) != p.MaxFarms() || int(sn) != p.MaxSubnets() || h != p.MaxHost() {
			t.Fatalf("plan %v: highest ids -> %v -> %d/%d/%d %v", p, a, f, sn, h, ok)
		}
	})
}

func TestFarmPrefixFollowsThePlan(t *testing.T) {
	if got := Default().FarmPrefix(3).String(); got != "10.3.0.0/16" {
		t.Errorf("default farm 3: %s, want 10.3.0.0/16", got)
	}
	if got := MustParse("10.0.0.0/8:12/6/6").FarmPrefix(300).String(); got != "10.18.192.0/20" {
		t.Errorf("12/6/6 farm 300: %s, want 10.18.192.0/20", got)
	}
}
