package portspace

import (
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"
)

var (
	tcp  = layers.IPProtocolTCP
	udp  = layers.IPProtocolUDP
	icmp = layers.IPProtocolICMPv4
)

func fromInet(proto layers.IPProtocol, dport uint16) frame {
	return frame{src: peerMAC, dst: upMAC, saddr: inet, daddr: public, proto: proto, sport: 53, dport: dport}
}

func in(s string) map[string]string  { return map[string]string{s: "in"} }
func out(s string) map[string]string { return map[string]string{s: "out"} }

// From the fabric: by destination port to the sliver that leases it (both
// edges of every range), the rest to the host unchanged; ICMP errors by the
// quoted source port; later fragments where their first went.
func TestPrivilegedFabricSteersByPortToTheLeasingSliver(t *testing.T) {
	k, f, links := loadFeature(t)
	syncPlan(t, f, testPlan(0))
	if links.slivers["s0-s1"] != s1If || links.slivers["s1-s2"] != s2If1 || !links.lo {
		t.Fatalf("sync attached %v (lo %v)", links.slivers, links.lo)
	}
	up := k.UplinkProgram()
	toSliver := func(name string, in frame, ifindex uint32, sliver string) row {
		return row{name: name, prog: up, in: in, verdict: actRedirect, to: ifindex, kind: kindPeer, drop: "", counts: map[string]string{sliver: "in"}, wantDst: upMAC}
	}
	toHost := func(name string, in frame) row {
		return row{name: name, prog: up, in: in, verdict: actOK}
	}
	quoted := func(proto layers.IPProtocol, src netip.Addr, sport uint16) *frame {
		return &frame{saddr: src, daddr: inet, proto: proto, sport: sport, dport: 53}
	}
	unreach := func(q *frame, typ uint8) frame {
		return frame{src: peerMAC, dst: upMAC, saddr: inet, daddr: public, proto: icmp, icmpType: typ, icmpCode: 3, quote: q}
	}
	first := fromInet(udp, 10001)
	first.ipID, first.moreFrags = 77, true
	later := fromInet(udp, 0)
	later.ipID, later.fragOffset = 77, 5
	stray := later
	stray.ipID = 78
	arpReply := frame{src: peerMAC, dst: upMAC, saddr: inet, daddr: public, arpOp: 2}
	arpReq := frame{src: peerMAC, dst: upMAC, saddr: inet, daddr: public, arpOp: 1}
	run(t, k, f, []row{
		toSliver("tcp to the low edge of s1's lease", fromInet(tcp, 10000), s1If, "s1"),
		toSliver("udp to the high edge of s1's lease", fromInet(udp, 10099), s1If, "s1"),
		toSliver("tcp to the low edge of s2's lease", fromInet(tcp, 10100), s2If, "s2"),
		toSliver("udp to the high edge of s2's lease", fromInet(udp, 10199), s2If, "s2"),
		toSliver("a one-port lease", fromInet(tcp, 30000), s3If, "s3"),
		toHost("below s1's lease: the host's", fromInet(tcp, 9999)),
		toHost("above s2's lease: the host's", fromInet(udp, 10200)),
		toHost("above s3's one port", fromInet(tcp, 30001)),
		toHost("another address", frame{src: peerMAC, dst: upMAC, saddr: inet, daddr: other, proto: tcp, sport: 53, dport: 10000}),
		toHost("IPv6", frame{src: peerMAC, dst: upMAC, ipv6: true}),
		toHost("echo requests are the host's", frame{src: peerMAC, dst: upMAC, saddr: inet, daddr: public, proto: icmp, icmpType: 8, icmpID: 10005}),
		toHost("an echo reply nobody asked for, even with a leased id", frame{src: peerMAC, dst: upMAC, saddr: inet, daddr: public, proto: icmp, icmpType: 0, icmpID: 10005}),
		toHost("ARP requests are the host's", arpReq),
		{name: "an ARP reply for the address reaches the host and every sliver of the uplink", prog: up, in: arpReply, verdict: actOK, clones: []uint32{s1If, s2If, s3If}},
		toSliver("port unreachable about s1's port", unreach(quoted(udp, public, 10005), 3), s1If, "s1"),
		toSliver("time exceeded about s2's port", unreach(quoted(tcp, public, 10150), 11), s2If, "s2"),
		toHost("frag needed about the host's port", unreach(quoted(tcp, public, 9000), 3)),
		toHost("an error quoting another source", unreach(quoted(udp, other, 10005), 3)),
		toSliver("a first fragment goes by its port", first, s1If, "s1"),
		toSliver("its later fragment follows it", later, s1If, "s1"),
		toHost("a later fragment whose first went nowhere", stray),
	})
}
