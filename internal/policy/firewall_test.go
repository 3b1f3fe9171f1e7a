package policy

import (
	"errors"
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

// One meaning per port pair, shared by the CLI, the API and the topology
// file: (0,0) any port, lo alone the one port lo..lo, lo..hi a range; a pair
// the datapath would read differently from what it says is rejected, naming
// the field to fix.
func TestPortRangesHaveOneMeaningOrAreRejected(t *testing.T) {
	cases := []struct {
		lo, hi         uint16
		wantLo, wantHi uint16
		field          string
	}{
		{0, 0, 0, 0, ""},
		{22, 0, 22, 22, ""},
		{22, 22, 22, 22, ""},
		{8000, 8080, 8000, 8080, ""},
		{1, 65535, 1, 65535, ""},
		{0, 80, 0, 0, "portLo"},  // matched every port
		{90, 80, 0, 0, "portHi"}, // matched none
	}
	for _, c := range cases {
		lo, hi, err := NormalizePorts(c.lo, c.hi)
		var fe *FieldError
		switch {
		case c.field == "" && (err != nil || lo != c.wantLo || hi != c.wantHi):
			t.Errorf("%d..%d: got %d..%d, %v; want %d..%d", c.lo, c.hi, lo, hi, err, c.wantLo, c.wantHi)
		case c.field != "" && (!errors.As(err, &fe) || fe.Field != c.field):
			t.Errorf("%d..%d: err %v, want one naming %s", c.lo, c.hi, err, c.field)
		}
	}
	// Stored form: lo alone is not a stored range (the datapath would match
	// nothing), so the agent's check rejects it too.
	if err := CheckPorts(22, 0); err == nil {
		t.Error("CheckPorts(22, 0) accepted a pair the datapath reads as no port")
	}
	for _, s := range []string{"0", "0-80", "90-80", "x", "1-", "70000"} {
		if _, _, err := ParsePorts(s); err == nil {
			t.Errorf("ParsePorts(%q) accepted", s)
		}
	}
}

func TestFirewallRulesAreNormalizedSoCaseDoesNotMakeANewRule(t *testing.T) {
	got, err := NormalizeFirewallRule(intent.FirewallRule{Dir: "IN", Proto: "TCP", PortLo: 22, CIDR: "10.1.2.7/24", Action: "Deny"})
	want := intent.FirewallRule{Dir: "in", Proto: "tcp", PortLo: 22, PortHi: 22, CIDR: "10.1.2.0/24", Action: "deny"}
	if err != nil || got != want {
		t.Fatalf("got %+v, %v; want %+v", got, err, want)
	}
	if got, err := NormalizeFirewallRule(intent.FirewallRule{Dir: "out", Proto: "ANY", Action: "allow"}); err != nil || got.Proto != "" {
		t.Fatalf("proto any stored as %q (%v), want \"\"", got.Proto, err)
	}
	bad := []struct {
		r     intent.FirewallRule
		field string
	}{
		{intent.FirewallRule{Dir: "up", Action: "deny"}, "dir"},
		{intent.FirewallRule{Dir: "in", Action: "maybe"}, "action"},
		{intent.FirewallRule{Dir: "in", Action: "deny", Proto: "sctp"}, "proto"},
		{intent.FirewallRule{Dir: "in", Action: "deny", Proto: "icmp", PortLo: 7}, "portLo"},
		{intent.FirewallRule{Dir: "in", Action: "deny", PortHi: 7}, "portLo"},
		{intent.FirewallRule{Dir: "in", Action: "deny", CIDR: "::/0"}, "cidr"},
	}
	for _, b := range bad {
		var fe *FieldError
		if _, err := NormalizeFirewallRule(b.r); !errors.As(err, &fe) || fe.Field != b.field {
			t.Errorf("%+v: err %v, want one naming %s", b.r, err, b.field)
		}
	}
	r, err := NormalizeRule(intent.Rule{From: "b/web", To: "b/db", Proto: "UDP", Port: 53})
	if err != nil || r.Proto != "udp" {
		t.Fatalf("rule proto %q, %v", r.Proto, err)
	}
}
