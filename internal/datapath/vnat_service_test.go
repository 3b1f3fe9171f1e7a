package datapath

import (
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
)

// FeatureVNATLocation is asserted here against the C: the agent's relay
// sets this bit.
func TestFeatureVNATLocationIsTheCBit(t *testing.T) {
	if FeatureVNATLocation != 1<<2 {
		t.Fatalf("FeatureVNATLocation %#x, want 1<<2 (bpf/lib/common.h)", FeatureVNATLocation)
	}
}

// TestPrivilegedVNATLocationServiceGoesToTheHostStackOnly: with the bit set
// a VM's TCP to 169.254.20.31:2031 goes to the host's stack (TC_ACT_OK,
// unchanged bytes, counted vnat_location), and nothing else does: another
// port, UDP, a fragment, a spoofed source, and the same packet with the
// bit clear all stay dropped as before.
func TestPrivilegedVNATLocationServiceGoesToTheHostStackOnly(t *testing.T) {
	k := loadTestKernel(t)
	tcp, udp := layers.IPProtocolTCP, layers.IPProtocolUDP
	svc := netip.MustParseAddr("169.254.20.31")
	to := func(proto layers.IPProtocol, dport uint16) frame {
		return frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: svc, Proto: proto, Dport: dport}
	}
	service := to(tcp, 2031)
	off := []progCase{
		{name: "bit clear: the service is no route", in: service, wantVerdict: bpftest.ActShot, wantDrop: "no_route"},
	}
	runTable(t, k, k.VifProgram(), off)
	if err := k.SetFeatures(FeatureVNATLocation); err != nil {
		t.Fatal(err)
	}
	frag := service
	frag.MoreFragments = true
	spoofed := service
	spoofed.Saddr = web3
	on := []progCase{
		{name: "tcp to the service goes to the host's stack unchanged", in: service, wantVerdict: bpftest.ActOK, want: &service, wantForward: "vnat_location"},
		{name: "another tcp port of the address is no route", in: to(tcp, 22), wantVerdict: bpftest.ActShot, wantDrop: "no_route"},
		{name: "udp to the service port is no route", in: to(udp, 2031), wantVerdict: bpftest.ActShot, wantDrop: "no_route"},
		{name: "a fragment is no route", in: frag, wantVerdict: bpftest.ActShot, wantDrop: "no_route"},
		{name: "a spoofed source is dropped first", in: spoofed, wantVerdict: bpftest.ActShot, wantDrop: "spoofed_ip"},
	}
	runTable(t, k, k.VifProgram(), on)
}
