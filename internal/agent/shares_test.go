package agent

import (
	"testing"
	"time"
)

func TestAFloodingVMUsesOnlyItsOwnShare(t *testing.T) {
	now := time.Unix(100, 0)
	s := NewShares(DHCPPerSecond, DHCPBurst, func() time.Time { return now })
	granted := 0
	for i := 0; i < 10000; i++ {
		if s.Allow("blue/web/flooder", "dhcp") {
			granted++
		}
	}
	if granted != DHCPBurst {
		t.Fatalf("flooder got %d answers in one instant, want its burst %d", granted, DHCPBurst)
	}
	if !s.Allow("blue/web/victim", "dhcp") {
		t.Fatal("another VM's first DHCP request was refused while one VM flooded")
	}
	got := s.Refused()
	if len(got) != 1 || got[0].VM != "blue/web/flooder" || got[0].Count != 10000-DHCPBurst {
		t.Fatalf("refusals = %+v, want only the flooder's %d", got, 10000-DHCPBurst)
	}
}

func TestASharRefillsAtItsRate(t *testing.T) {
	now := time.Unix(100, 0)
	s := NewShares(DHCPPerSecond, DHCPBurst, func() time.Time { return now })
	for s.Allow("vm", "dhcp") {
	}
	now = now.Add(time.Second)
	granted := 0
	for s.Allow("vm", "dhcp") {
		granted++
	}
	if granted != DHCPPerSecond {
		t.Fatalf("after 1 s the share gave %d, want %d", granted, DHCPPerSecond)
	}
}
