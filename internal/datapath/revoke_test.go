package datapath

import (
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/intent"
)

// Revocation (docs/virtual-router.md): when the rules change, an admitted
// flow is checked again at its next packet; one no longer allowed is cut
// there and counted once as revoked, on the host that cut it. These rows
// count it for each thing a tenant can take away: a visibility rule (and a
// peering, which withdraws the same cross-farm visibility entries), and a
// firewall allow.

// A flow across farms is cut when the peering goes: the controller then
// compiles no visibility between the farms, which is what these maps see.
func TestPrivilegedRevokedCountsEachCutFlowOnce(t *testing.T) {
	red1 := netip.MustParseAddr("10.2.1.2") // farm 2, on h2
	d := testDesired()
	d.Visibility = append(d.Visibility, intent.VisRule{SrcFarm: 1, SrcSubnet: 1, DstFarm: 2, DstSubnet: 1, Proto: 6, Port: 443})
	k := loadTestKernelWith(t, d)
	seedMapping(t, k, red1, h2MAC)
	tcp := layers.IPProtocolTCP
	toDB := frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: tcp, Sport: 40000, Dport: 5432}
	toRed := frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: red1, Proto: tcp, Sport: 40001, Dport: 443}
	fromRed := frame{Src: h2MAC, Dst: h1MAC, Saddr: red1, Daddr: web1, Proto: tcp, Sport: 443, Dport: 40001}
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "positive control: web1 -> db1:5432 flows", in: toDB, wantVerdict: bpftest.ActRedirect,
			want: routedOut(toDB), wantTo: 7, wantForward: "to_fabric,routed"},
		{name: "positive control: web1 -> red1:443 flows across farms", in: toRed, wantVerdict: bpftest.ActRedirect,
			want: routedOut(toRed), wantTo: 7, wantForward: "to_fabric,routed"},
	})
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "positive control: red1's reply comes in", in: fromRed, wantVerdict: bpftest.ActRedirect,
			want:   &frame{Src: vmac(gw), Dst: vmac(web1), Saddr: red1, Daddr: web1, Proto: tcp, Sport: 443, Dport: 40001},
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
	})

	// The peering is withdrawn: blue's rule to red no longer compiles.
	d.Visibility = d.Visibility[:len(d.Visibility)-1]
	applyDesired(t, k, d)
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "red1's next reply: its flow is cut, counted as revoked", in: fromRed, wantVerdict: bpftest.ActShot, wantDrop: "revoked"},
		{name: "and the one after is refused for why the flow was cut (counted once)", in: fromRed, wantVerdict: bpftest.ActShot, wantDrop: "not_visible"},
	})
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "web1's next packet to red1 is refused too: the flow is cut both ways", in: toRed, wantVerdict: bpftest.ActShot, wantDrop: "not_visible"},
		{name: "the flow to db1, which the change did not touch, still flows", in: toDB, wantVerdict: bpftest.ActRedirect,
			want: routedOut(toDB), wantTo: 7, wantForward: "to_fabric,routed"},
	})
	cut := 0
	for _, e := range conntrackEntries(t, k) {
		if e.Opened&ctCut != 0 {
			cut++
		}
	}
	if cut != 1 {
		t.Fatalf("%d cut entries in conntrack, want the one flow to red1", cut)
	}

	// Peered again: the cut flow is admitted the way it was opened again.
	d.Visibility = append(d.Visibility, intent.VisRule{SrcFarm: 1, SrcSubnet: 1, DstFarm: 2, DstSubnet: 1, Proto: 6, Port: 443})
	applyDesired(t, k, d)
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "peered again, web1 -> red1:443 flows again", in: toRed, wantVerdict: bpftest.ActRedirect,
			want: routedOut(toRed), wantTo: 7, wantForward: "to_fabric,routed"},
	})
}

// A cut flow stays cut even where the new rules would let its reply open
// a flow of its own: judged on its own, that reply would bring the flow
// back, its opener's packets passing as answers.
func TestPrivilegedACutFlowsReplyDoesNotReopenIt(t *testing.T) {
	k := loadTestKernel(t)
	tcp := layers.IPProtocolTCP
	open := frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: tcp, Dport: 5432}
	runTable(t, k, k.VifProgram(), []progCase{{name: "positive control: web1 opens tcp/5432 to db1",
		in: open, wantVerdict: bpftest.ActRedirect, want: routedOut(open), wantTo: 7, wantForward: "to_fabric,routed"}})
	// web -> db goes, db -> web any tcp comes.
	d := testDesired()
	d.Visibility = []intent.VisRule{{SrcFarm: 1, SrcSubnet: 2, DstFarm: 1, DstSubnet: 1, Proto: 6}}
	applyDesired(t, k, d)
	reply := frame{Src: h2MAC, Dst: h1MAC, Saddr: db1, Daddr: web1, Proto: tcp, Sport: 5432, Dport: 40000}
	fresh := frame{Src: h2MAC, Dst: h1MAC, Saddr: db1, Daddr: web1, Proto: tcp, Sport: 50000, Dport: 22}
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "db1's reply cuts the flow, counted as revoked", in: reply, wantVerdict: bpftest.ActShot, wantDrop: "revoked"},
		{name: "its next reply stays refused, though db -> web tcp is allowed now", in: reply, wantVerdict: bpftest.ActShot, wantDrop: "not_visible"},
		{name: "a flow db1 opens itself passes on the new rule", in: fresh, wantVerdict: bpftest.ActRedirect,
			want:   &frame{Src: vmac(gw), Dst: vmac(web1), Saddr: db1, Daddr: web1, Proto: tcp, Sport: 50000, Dport: 22},
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
	})
	runTable(t, k, k.VifProgram(), []progCase{{name: "web1's side of the cut flow stays refused",
		in: open, wantVerdict: bpftest.ActShot, wantDrop: "not_visible"}})
}

// A firewall allow removed cuts what it admitted, on the VM's host.
func TestPrivilegedRemovedFirewallAllowCutsItsFlows(t *testing.T) {
	web4 := netip.MustParseAddr("10.1.1.5") // on h2
	d := testDesired()
	d.Local[1].Firewall = &intent.Firewall{DefaultIn: "deny", DefaultOut: "allow", Rules: []intent.FirewallRule{
		{Dir: "in", Proto: "tcp", PortLo: 22, PortHi: 22, Action: "allow"},
	}}
	k := loadTestKernelWithIfindex(t, d, web3OnLoopback)
	seedMapping(t, k, web4, h2MAC)
	tcp := layers.IPProtocolTCP
	ssh := frame{Src: h2MAC, Dst: h1MAC, Saddr: web4, Daddr: web3, Proto: tcp, Sport: 40000, Dport: 22}
	reply := frame{Src: vmac(web3), Dst: vmac(web4), Saddr: web3, Daddr: web4, Proto: tcp, Sport: 22, Dport: 40000}
	runTable(t, k, k.UplinkProgram(), []progCase{{name: "positive control: ssh from web4 is allowed in",
		in: ssh, wantVerdict: bpftest.ActRedirect, want: &frame{Src: vmac(web4), Dst: vmac(web3), Saddr: web4, Daddr: web3, Proto: tcp, Sport: 40000, Dport: 22},
		wantTo: 1, wantPeer: true, wantForward: "from_fabric"}})

	d.Local[1].Firewall.Rules = nil // the allow removed: default deny
	if err := k.Apply(compileTest(t, d, web3OnLoopback), ""); err != nil {
		t.Fatal(err)
	}
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "web3's next reply: the flow is cut, counted as revoked", in: reply, wantVerdict: bpftest.ActShot, wantDrop: "revoked"},
		{name: "web3's replies stay refused, though its firewall lets anything out", in: reply, wantVerdict: bpftest.ActShot, wantDrop: "firewall_in"},
	})
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "web4's next packet is refused: its firewall no longer admits the flow", in: ssh, wantVerdict: bpftest.ActShot, wantDrop: "firewall_in"},
	})
}
