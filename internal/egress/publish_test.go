package egress

import (
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/intent"
)

// Published ports in BPF_PROG_RUN: a packet to a host's published port
// steered into its VM with only its destination rewritten, the VM's answer
// given the host's address and public port back, and everything else of
// the host's address left to the host. a publishes tcp 80 on 8080 with no
// slice (its farm has no egress); b, with a slice, publishes udp 53 on 5353.
func publishDesired() intent.Desired {
	d := egressDesired()
	d.Local[0].Egress = nil
	d.Local[0].Published = []intent.Publication{{Proto: "tcp", Port: 80, PublicPort: 8080}, {Proto: "udp", Port: 9000, PublicPort: 9900}}
	d.Local[1].Published = []intent.Publication{{Proto: "udp", Port: 53, PublicPort: 5353}}
	return d
}

func TestPrivilegedPublishedPortsReachTheirVMWithTheClientsOwnAddress(t *testing.T) {
	h := loadEgressHost(t, publishDesired())
	vif, up := h.k.VifProgram(), h.k.UplinkProgram()
	tcp, udp := layers.IPProtocolTCP, layers.IPProtocolUDP
	client := func(f bpftest.Frame) bpftest.Frame { // from inet to the host's address
		f.Src, f.Dst, f.Saddr, f.Daddr = inetMAC, h1MAC, inet, hostAddr
		return f
	}
	into := func(vm netip.Addr, f bpftest.Frame) []byte { // as the VM gets it: from its gateway, one hop taken
		f.Src, f.Dst, f.Daddr, f.TTL = vmac(gw), vmac(vm), vm, 63
		return f.Bytes(t)
	}
	toHost := bpftest.Counters{"forward host_stack": 1}
	bpftest.RunTable(t, h.counters, []bpftest.Row{
		{Name: "inet's SYN to the host's 8080 reaches a's port 80 from inet's own address and port", Prog: up,
			In:      client(bpftest.Frame{Proto: tcp, Sport: 40000, Dport: 8080}).Bytes(t),
			Out:     into(vmA, bpftest.Frame{Saddr: inet, Proto: tcp, Sport: 40000, Dport: 80}),
			Verdict: bpftest.ActRedirect, To: 1, Kind: bpftest.RedirectPeer, Counters: bpftest.Counters{"forward egress_in": 1, "a in": 1}},
		{Name: "udp to 8080 is not published: the host's", Prog: up,
			In: client(bpftest.Frame{Proto: udp, Sport: 40000, Dport: 8080}).Bytes(t), Verdict: bpftest.ActOK, Counters: toHost},
		{Name: "the host's port 8081 is the host's", Prog: up,
			In: client(bpftest.Frame{Proto: tcp, Sport: 40000, Dport: 8081}).Bytes(t), Verdict: bpftest.ActOK, Counters: toHost},
		{Name: "the VM's port itself on the host's address is the host's", Prog: up,
			In: client(bpftest.Frame{Proto: tcp, Sport: 40000, Dport: 80}).Bytes(t), Verdict: bpftest.ActOK, Counters: toHost},
		{Name: "udp to 5353 reaches b's port 53, b having a slice too", Prog: up,
			In:      client(bpftest.Frame{Proto: udp, Sport: 41000, Dport: 5353}).Bytes(t),
			Out:     into(vmB, bpftest.Frame{Saddr: inet, Proto: udp, Sport: 41000, Dport: 53}),
			Verdict: bpftest.ActRedirect, To: vmBIfindex, Kind: bpftest.RedirectPeer, Counters: bpftest.Counters{"forward egress_in": 1, "b in": 1}},
		{Name: "tcp to 5353 is not steered", Prog: up,
			In: client(bpftest.Frame{Proto: tcp, Sport: 41000, Dport: 5353}).Bytes(t), Verdict: bpftest.ActOK, Counters: toHost},
	})

	wire := func(f bpftest.Frame) []byte { // as a's answer leaves: the host's address and public port
		f.Src, f.Dst, f.TTL = vmac(vmA), vmac(gw), 63
		return f.Bytes(t)
	}
	bpftest.RunTable(t, h.counters, []bpftest.Row{
		{Name: "a's SYN-ACK from port 80 leaves as the host's 8080", Prog: vif,
			In:      fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: tcp, Sport: 80, Dport: 40000, ACK: true}).Bytes(t),
			Out:     wire(bpftest.Frame{Saddr: hostAddr, Daddr: inet, Proto: tcp, Sport: 8080, Dport: 40000, ACK: true}),
			Verdict: bpftest.ActRedirect, To: uplinkIfindex, Kind: bpftest.RedirectNeigh, Counters: bpftest.Counters{"forward egress_out": 1, "a out": 1}},
		{Name: "a SYN from the published port opens nothing", Prog: vif,
			In:      fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: tcp, Sport: 80, Dport: 40000}).Bytes(t),
			Verdict: bpftest.ActShot, Counters: bpftest.Counters{"drop publish_open": 1}},
		{Name: "another port of a, whose farm has no egress, goes nowhere", Prog: vif,
			In:      fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: tcp, Sport: 81, Dport: 40000, ACK: true}).Bytes(t),
			Verdict: bpftest.ActShot, Counters: bpftest.Counters{"drop no_route": 1}},
		{Name: "udp from port 80 is not the publication's", Prog: vif,
			In:      fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: udp, Sport: 80, Dport: 40000}).Bytes(t),
			Verdict: bpftest.ActShot, Counters: bpftest.Counters{"drop no_route": 1}},
	})

	// A large udp answer of a (published ports only): its later fragment
	// follows the first with the host's address.
	first := fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: udp, Sport: 9000, Dport: 41000, IPID: 700, MoreFragments: true})
	later := fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: udp, IPID: 700, FragOffset: 185})
	wireLater := later
	wireLater.Saddr, wireLater.TTL = hostAddr, 63
	outA := bpftest.Counters{"forward egress_out": 1, "a out": 1}
	bpftest.RunTable(t, h.counters, []bpftest.Row{
		{Name: "a's first fragment from 9000 leaves as the host's 9900", Prog: vif, In: first.Bytes(t),
			Out:     wire(bpftest.Frame{Saddr: hostAddr, Daddr: inet, Proto: udp, Sport: 9900, Dport: 41000, IPID: 700, MoreFragments: true}),
			Verdict: bpftest.ActRedirect, To: uplinkIfindex, Kind: bpftest.RedirectNeigh, Counters: outA},
		{Name: "its later fragment follows with the host's address", Prog: vif, In: later.Bytes(t), Out: headerOnly(t, wireLater, later),
			Verdict: bpftest.ActRedirect, To: uplinkIfindex, Kind: bpftest.RedirectNeigh, Counters: outA},
		{Name: "a later fragment of nothing translated goes nowhere", Prog: vif,
			In:      fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: udp, IPID: 701, FragOffset: 185}).Bytes(t),
			Verdict: bpftest.ActShot, Counters: bpftest.Counters{"drop no_route": 1}},
	})
	rfirst := client(bpftest.Frame{Proto: udp, Sport: 41000, Dport: 9900, IPID: 500, MoreFragments: true})
	rlater := client(bpftest.Frame{Proto: udp, IPID: 500, FragOffset: 185})
	inA := bpftest.Counters{"forward egress_in": 1, "a in": 1}
	bpftest.RunTable(t, h.counters, []bpftest.Row{
		{Name: "inet's first fragment to 9900 reaches a's 9000", Prog: up, In: rfirst.Bytes(t),
			Out:     into(vmA, bpftest.Frame{Saddr: inet, Proto: udp, Sport: 41000, Dport: 9000, IPID: 500, MoreFragments: true}),
			Verdict: bpftest.ActRedirect, To: 1, Kind: bpftest.RedirectPeer, Counters: inA},
		{Name: "and its later fragment follows it", Prog: up, In: rlater.Bytes(t),
			Out:     headerOnly(t, bpftest.Frame{Src: vmac(gw), Dst: vmac(vmA), Saddr: inet, Daddr: vmA, Proto: udp, IPID: 500, FragOffset: 185, TTL: 63}, rlater),
			Verdict: bpftest.ActRedirect, To: 1, Kind: bpftest.RedirectPeer, Counters: inA},
	})

	// b on lo: its answer from 53 leaves as 5353, not by its slice.
	h.onLo(t, "b")
	bpftest.RunTable(t, h.counters, []bpftest.Row{
		{Name: "b's udp answer from 53 leaves as the host's 5353", Prog: vif,
			In:      fromVM(vmB, bpftest.Frame{Daddr: inet, Proto: udp, Sport: 53, Dport: 41000}).Bytes(t),
			Out:     bpftest.Frame{Src: vmac(vmB), Dst: vmac(gw), Saddr: hostAddr, Daddr: inet, Proto: udp, Sport: 5353, Dport: 41000, TTL: 63}.Bytes(t),
			Verdict: bpftest.ActRedirect, To: uplinkIfindex, Kind: bpftest.RedirectNeigh, Counters: bpftest.Counters{"forward egress_out": 1, "b out": 1}},
	})

	// Unpublished: the port is the host's again, and so is the way out.
	d := publishDesired()
	d.Local[0].Published, d.Local[1].Published = nil, nil
	h.sync(t, d)
	h.onLo(t, "a")
	bpftest.RunTable(t, h.counters, []bpftest.Row{
		{Name: "once unpublished, 8080 is the host's", Prog: up,
			In: client(bpftest.Frame{Proto: tcp, Sport: 40000, Dport: 8080}).Bytes(t), Verdict: bpftest.ActOK, Counters: toHost},
		{Name: "and 5353 too", Prog: up,
			In: client(bpftest.Frame{Proto: udp, Sport: 41000, Dport: 5353}).Bytes(t), Verdict: bpftest.ActOK, Counters: toHost},
		{Name: "and a's answers from 80 go nowhere", Prog: vif,
			In:      fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: tcp, Sport: 80, Dport: 40000, ACK: true}).Bytes(t),
			Verdict: bpftest.ActShot, Counters: bpftest.Counters{"drop no_route": 1}},
	})
}

func TestPrivilegedPublishedPortObeysTheVMsInboundFirewall(t *testing.T) {
	d := publishDesired()
	d.Local[0].Firewall = &intent.Firewall{DefaultIn: "allow", DefaultOut: "allow",
		Rules: []intent.FirewallRule{{Dir: "in", Proto: "tcp", PortLo: 80, PortHi: 80, CIDR: inet.String() + "/32", Action: "deny"}}}
	h := loadEgressHost(t, d)
	in := func(src string, sport uint16) []byte {
		f := bpftest.Frame{Src: inetMAC, Dst: h1MAC, Saddr: inet, Daddr: hostAddr, Proto: layers.IPProtocolTCP, Sport: sport, Dport: 8080}
		if src != "" {
			f.Saddr = far
		}
		return f.Bytes(t)
	}
	bpftest.RunTable(t, h.counters, []bpftest.Row{
		{Name: "a's firewall denies inet on port 80: dropped, counted", Prog: h.k.UplinkProgram(), In: in("", 40000),
			Verdict: bpftest.ActShot, Counters: bpftest.Counters{"drop firewall_in": 1}},
		{Name: "another client is let in", Prog: h.k.UplinkProgram(), In: in("far", 40000),
			Out:     bpftest.Frame{Src: vmac(gw), Dst: vmac(vmA), Saddr: far, Daddr: vmA, Proto: layers.IPProtocolTCP, Sport: 40000, Dport: 80, TTL: 63}.Bytes(t),
			Verdict: bpftest.ActRedirect, To: 1, Kind: bpftest.RedirectPeer, Counters: bpftest.Counters{"forward egress_in": 1, "a in": 1}},
	})
}
