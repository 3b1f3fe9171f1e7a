package datapath

import (
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/intent"
)

// useTwelveSixSix makes the process's plan 10.0.0.0/8:12/6/6 for one test
// (the programs take it when they are loaded) and the default after.
func useTwelveSixSix(t *testing.T) addrplan.Plan {
	t.Helper()
	p := addrplan.MustParse("10.0.0.0/8:12/6/6")
	if err := addrplan.Set(p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { addrplan.Set(addrplan.Default()) })
	return p
}

func TestPrivilegedFarm300OfATwelveSixSixPlanIsRoutedAdmittedAndScoped(t *testing.T) {
	p := useTwelveSixSix(t)
	var (
		a    = p.Address(300, 1, 2) // 10.18.192.66, local on ifindex 1
		b    = p.Address(300, 1, 3) // local, ifindex 42
		c    = p.Address(300, 1, 4) // on h2, same subnet
		d    = p.Address(300, 2, 2) // on h2, subnet 2
		gw1  = p.Gateway(300, 1)
		bc1  = p.Broadcast(300, 1) // 10.18.192.127
		sub1 = bpftest.MustMAC("03:01:0a:2c:01:00")
		sub2 = bpftest.MustMAC("03:01:0a:2c:02:00")
		// Farm 44 subnet 1 host 2 is 10.0.176.66: its low byte of farm
		// id is 300's (0x2c), and the old 10.f.s.h reading of 300's
		// addresses (10.18...) names farm 18 instead; neither is 300.
		other = p.Address(44, 1, 2)
	)
	if a != netip.MustParseAddr("10.18.192.66") || bc1 != netip.MustParseAddr("10.18.192.127") {
		t.Fatalf("12/6/6 addresses: %v %v", a, bc1)
	}
	local := func(name string, ip netip.Addr) intent.LocalEndpoint {
		return intent.LocalEndpoint{Name: "big/s1/" + name, IP: ip.String(), MAC: vmac(ip).String(), Interface: "vif-" + name}
	}
	desired := intent.Desired{Node: "h1", VMNet: "10.0.0.0/8",
		Local: []intent.LocalEndpoint{local("web1", a), local("web3", b)},
		Visibility: []intent.VisRule{
			{SrcFarm: 300, SrcSubnet: 1, DstFarm: 300, DstSubnet: 2, Proto: 6, Port: 5432},
			{SrcFarm: 300, SrcSubnet: 2, DstFarm: 300, DstSubnet: 1, Proto: 1},
		}}
	k := loadTestKernelWith(t, desired)
	seedMapping(t, k, c, h2MAC)
	seedMapping(t, k, d, h2MAC)
	seedMapping(t, k, other, h2MAC)
	e := compileTest(t, desired, testIfindex)
	if _, ok := e.Scopes[ScopeKey{Farm: 300, Subnet: 1}]; !ok {
		t.Fatalf("no scope 300/1 in %+v", e.Scopes)
	}
	tcp, udp, icmp := layers.IPProtocolTCP, layers.IPProtocolUDP, layers.IPProtocolICMPv4
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "tcp to a VM of farm 300 on this host",
			in:          frame{Src: vmac(a), Dst: vmac(b), Saddr: a, Daddr: b, Proto: tcp},
			wantVerdict: bpftest.ActRedirect, want: &frame{Src: vmac(a), Dst: vmac(b), Saddr: a, Daddr: b, Proto: tcp},
			wantTo: 42, wantPeer: true, wantForward: "local"},
		{name: "udp to a VM of farm 300 on h2 leaves host to host",
			in:          frame{Src: vmac(a), Dst: vmac(c), Saddr: a, Daddr: c, Proto: udp},
			wantVerdict: bpftest.ActRedirect, want: &frame{Src: h1MAC, Dst: h2MAC, Saddr: a, Daddr: c, Proto: udp},
			wantTo: 7, wantForward: "to_fabric"},
		{name: "tcp to the allowed port of subnet 2 crosses the /26's gateway",
			in:          frame{Src: vmac(a), Dst: vmac(gw1), Saddr: a, Daddr: d, Proto: tcp, Dport: 5432},
			wantVerdict: bpftest.ActRedirect, want: &frame{Src: h1MAC, Dst: h2MAC, Saddr: a, Daddr: d, Proto: tcp, Dport: 5432, TTL: 63},
			wantTo: 7, wantForward: "to_fabric,routed"},
		{name: "another port of subnet 2 has no rule",
			in:          frame{Src: vmac(a), Dst: vmac(gw1), Saddr: a, Daddr: d, Proto: tcp, Dport: 80},
			wantVerdict: bpftest.ActShot, wantDrop: "not_visible"},
		{name: "farm 44, whose id shares 300's low byte, is not farm 300",
			in:          frame{Src: vmac(a), Dst: vmac(gw1), Saddr: a, Daddr: other, Proto: tcp, Dport: 5432},
			wantVerdict: bpftest.ActShot, wantDrop: "not_visible"},
		{name: "the subnet broadcast (host bits all set, .127 of the /26) goes to subnet 300/1's multicast MAC",
			in:          frame{Src: vmac(a), Dst: layers.EthernetBroadcast, Saddr: a, Daddr: bc1, Proto: udp},
			wantVerdict: bpftest.ActRedirect, want: &frame{Src: h1MAC, Dst: sub1, Saddr: a, Daddr: bc1, Proto: udp},
			wantTo: 7, wantClones: []uint32{42}, wantForward: "to_fabric"},
		{name: "the subnet's network address is no VM's",
			in:          frame{Src: vmac(a), Dst: vmac(gw1), Saddr: a, Daddr: p.Address(300, 1, 0), Proto: udp},
			wantVerdict: bpftest.ActShot, wantDrop: "no_route"},
	})
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "from h2, farm 300's VM of the same subnet is let in",
			in:          frame{Src: h2MAC, Dst: h1MAC, Saddr: c, Daddr: a, Proto: tcp},
			wantVerdict: bpftest.ActRedirect, want: &frame{Src: vmac(c), Dst: vmac(a), Saddr: c, Daddr: a, Proto: tcp},
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
		{name: "from subnet 2 with its rule, from the /26 gateway's MAC",
			in:          frame{Src: h2MAC, Dst: h1MAC, Saddr: d, Daddr: a, Proto: icmp, TTL: 63},
			wantVerdict: bpftest.ActRedirect, want: &frame{Src: vmac(gw1), Dst: vmac(a), Saddr: d, Daddr: a, Proto: icmp, TTL: 63},
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
		{name: "from subnet 2 without a rule for tcp",
			in:          frame{Src: h2MAC, Dst: h1MAC, Saddr: d, Daddr: a, Proto: tcp, Dport: 22},
			wantVerdict: bpftest.ActShot, wantDrop: "not_visible"},
		{name: "subnet 300/1's broadcast is copied to its two local VMs",
			in:          frame{Src: h2MAC, Dst: sub1, Saddr: c, Daddr: bc1, Proto: udp},
			wantVerdict: bpftest.ActShot, wantClones: []uint32{1, 42}, wantForward: "broadcast"},
		{name: "300/1's broadcast sent to 300/2's multicast MAC stays out",
			in:          frame{Src: h2MAC, Dst: sub2, Saddr: c, Daddr: bc1, Proto: udp},
			wantVerdict: bpftest.ActShot, wantDrop: "fabric_not_broadcast"},
		{name: "300/2's broadcast reaches nobody here: no VM of 300/2 on this host",
			in:          frame{Src: h2MAC, Dst: sub2, Saddr: d, Daddr: p.Broadcast(300, 2), Proto: udp},
			wantVerdict: bpftest.ActShot, wantDrop: "no_members"},
		{name: "a VM address is never a subnet's broadcast source",
			in:          frame{Src: h2MAC, Dst: h1MAC, Saddr: p.Broadcast(300, 1), Daddr: a, Proto: tcp},
			wantVerdict: bpftest.ActShot, wantDrop: "fabric_not_tenant"},
	})
}
