package datapath

import (
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/intent"
)

// Non-first fragments carry no ports; they pass by the datagram their
// first fragment opened on this host (bpf/lib/frag.h), on the sending
// host's vif and on the receiving host's uplink alike.

func TestPrivilegedLaterFragmentsPassByTheirFirstFragmentsAdmission(t *testing.T) {
	d := testDesired()
	// web may send udp/5353 to db; db may send udp/7000 to web.
	d.Visibility = append(d.Visibility,
		intent.VisRule{SrcFarm: 1, SrcSubnet: 1, DstFarm: 1, DstSubnet: 2, Proto: 17, Port: 5353},
		intent.VisRule{SrcFarm: 1, SrcSubnet: 2, DstFarm: 1, DstSubnet: 1, Proto: 17, Port: 7000})
	k := loadTestKernelWith(t, d)
	udp, icmp := layers.IPProtocolUDP, layers.IPProtocolICMPv4
	// A 3000-byte datagram leaves in three fragments: offsets 0, 185 and
	// 370 (in 8-byte units of 1480 bytes each).
	first := func(id uint16, dport uint16) frame {
		return frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: udp, Dport: dport, IPID: id, MoreFragments: true}
	}
	later := func(id uint16, off uint16, more bool) frame {
		return frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: udp, IPID: id, FragOffset: off, MoreFragments: more}
	}
	out := func(f frame) *frame {
		f.Src, f.Dst, f.TTL = h1MAC, h2MAC, 63
		return &f
	}
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "the first fragment of a datagram to an allowed port is admitted",
			in: first(100, 5353), wantVerdict: bpftest.ActRedirect, want: out(first(100, 5353)), wantTo: 7, wantForward: "to_fabric,routed"},
		{name: "its second fragment follows it",
			in: later(100, 185, true), wantVerdict: bpftest.ActRedirect, want: out(later(100, 185, true)), wantTo: 7, wantForward: "to_fabric,routed"},
		{name: "and its last",
			in: later(100, 370, false), wantVerdict: bpftest.ActRedirect, want: out(later(100, 370, false)), wantTo: 7, wantForward: "to_fabric,routed"},
		{name: "a later fragment of a datagram whose first fragment never came is dropped",
			in: later(101, 185, true), wantVerdict: bpftest.ActShot, wantDrop: "frag_no_first"},
		{name: "a first fragment to a port no rule opens is refused",
			in: first(102, 22), wantVerdict: bpftest.ActShot, wantDrop: "not_visible"},
		{name: "and its later fragments go nowhere either",
			in: later(102, 185, false), wantVerdict: bpftest.ActShot, wantDrop: "frag_no_first"},
		{name: "a first fragment too short to hold its ports is malformed",
			in:          frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: udp, Dport: 5353, IPID: 103, MoreFragments: true, CutL4: 4},
			wantVerdict: bpftest.ActShot, wantDrop: "malformed"},
	})

	// Receiving: db1's datagram to web1:7000, as h2 sends it on.
	fromDB := func(id uint16, off uint16, more bool) frame {
		return frame{Src: h2MAC, Dst: h1MAC, Saddr: db1, Daddr: web1, Proto: udp, Dport: 7000, IPID: id, FragOffset: off, MoreFragments: more, TTL: 63}
	}
	delivered := func(f frame) *frame {
		f.Src, f.Dst = vmac(gw), vmac(web1)
		return &f
	}
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "db1's first fragment to web1:7000 is admitted on the receiving host",
			in: fromDB(200, 0, true), wantVerdict: bpftest.ActRedirect, want: delivered(fromDB(200, 0, true)),
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
		{name: "and its later fragment too",
			in: fromDB(200, 185, false), wantVerdict: bpftest.ActRedirect, want: delivered(fromDB(200, 185, false)),
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
		{name: "but not one whose first fragment this host never admitted",
			in: fromDB(201, 185, false), wantVerdict: bpftest.ActShot, wantDrop: "frag_no_first"},
		// ping -s 3000 db1 -> web1, then web1's reply.
		{name: "db1's large echo request: first fragment",
			in:          frame{Src: h2MAC, Dst: h1MAC, Saddr: db1, Daddr: web1, Proto: icmp, ICMPID: 9, IPID: 300, MoreFragments: true, TTL: 63},
			wantVerdict: bpftest.ActRedirect, want: &frame{Src: vmac(gw), Dst: vmac(web1), Saddr: db1, Daddr: web1, Proto: icmp, ICMPID: 9, IPID: 300, MoreFragments: true, TTL: 63},
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
	})
	replyFirst := frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: icmp, ICMPType: 100, ICMPID: 9, IPID: 400, MoreFragments: true}
	replyLater := frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: icmp, IPID: 400, FragOffset: 185}
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "web1's large echo reply: its first fragment answers the flow",
			in: replyFirst, wantVerdict: bpftest.ActRedirect, want: out(replyFirst), wantTo: 7, wantForward: "to_fabric,routed"},
		{name: "and its later fragment follows (web may not ping db on its own)",
			in: replyLater, wantVerdict: bpftest.ActRedirect, want: out(replyLater), wantTo: 7, wantForward: "to_fabric,routed"},
	})
}

func TestPrivilegedLaterFragmentsPassAVMFirewallByTheirFirstFragment(t *testing.T) {
	d := testDesired()
	// web3 takes only udp/9000 from its subnet.
	d.Local[1].Firewall = &intent.Firewall{DefaultIn: "deny", DefaultOut: "allow", Rules: []intent.FirewallRule{
		{Dir: "in", Proto: "udp", PortLo: 9000, PortHi: 9000, CIDR: "10.1.1.0/24", Action: "allow"},
	}}
	k := loadTestKernelWithIfindex(t, d, web3OnLoopback)
	udp := layers.IPProtocolUDP
	in := func(id, dport, off uint16, more bool) frame {
		return frame{Src: h2MAC, Dst: h1MAC, Saddr: web2, Daddr: web3, Proto: udp, Dport: dport, IPID: id, FragOffset: off, MoreFragments: more}
	}
	delivered := func(f frame) *frame {
		f.Src, f.Dst = vmac(web2), vmac(web3)
		return &f
	}
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "the first fragment to udp/9000 passes web3's firewall",
			in: in(500, 9000, 0, true), wantVerdict: bpftest.ActRedirect, want: delivered(in(500, 9000, 0, true)),
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
		{name: "its later fragment follows",
			in: in(500, 0, 185, false), wantVerdict: bpftest.ActRedirect, want: delivered(in(500, 0, 185, false)),
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
		{name: "the first fragment to udp/9001 is refused",
			in: in(501, 9001, 0, true), wantVerdict: bpftest.ActShot, wantDrop: "firewall_in"},
		{name: "and its later fragment goes nowhere",
			in: in(501, 0, 185, false), wantVerdict: bpftest.ActShot, wantDrop: "frag_no_first"},
	})
}

// What the uplink does with a tagged frame: nothing of tenant space is
// tagged, so it is the host's own VLAN traffic and goes to its stack.
func TestPrivilegedTaggedFramesFromTheFabricAreTheHostStacks(t *testing.T) {
	k := loadTestKernel(t)
	tagged := frame{Src: h2MAC, Dst: h1MAC, Saddr: web2, Daddr: web1, Proto: layers.IPProtocolUDP, VLAN: 10}
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "a tagged frame with tenant addresses is left to the host's stack, untouched",
			in: tagged, wantVerdict: bpftest.ActOK, want: &tagged, wantForward: "host_stack"},
	})
}
