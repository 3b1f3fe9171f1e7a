package datapath

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
)

// The fabric is not trusted (bpf/lib/fabric_trust.h): every test here sends
// what a node on the fabric that is no host (or a host lying about a VM)
// could send. testNodes makes h2 and h3 known hosts; rogueMAC is on the
// fabric but in no node record.

func confirmedOf(t *testing.T, k *Kernel, ip netip.Addr) (uint64, bool) {
	t.Helper()
	var m Mapping
	if err := k.vif.Mappings.Lookup(IPKey(ip), &m); err != nil {
		return 0, false
	}
	return m.ConfirmedNs, true
}

func TestPrivilegedFabricARPRequestNeverMovesAMapping(t *testing.T) {
	k := loadTestKernel(t)
	subnetMAC := bpftest.MustMAC("03:00:0a:01:01:00")
	newVM := netip.MustParseAddr("10.1.1.70")
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "h3 asks for web1 as web2 (mapped to h2): answered, but web2 stays on h2",
			in:          arpFrame(h3MAC, subnetMAC, 1, vmac(web2), web2, nil, web1),
			wantVerdict: bpftest.ActRedirect, want: ptr(arpFrame(h1MAC, h3MAC, 2, vmac(web1), web1, vmac(web2), web2)),
			wantTo: 7, wantForward: "arp_answered"},
		{name: "a node that is no host asks for web1 as web2: refused, nothing learned",
			in:          arpFrame(rogueMAC, subnetMAC, 1, vmac(web2), web2, nil, web1),
			wantVerdict: bpftest.ActShot, wantDrop: "fabric_unknown_host"},
		{name: "a node that is no host asks for web1 as a new VM: refused",
			in:          arpFrame(rogueMAC, h1MAC, 1, vmac(newVM), newVM, nil, web1),
			wantVerdict: bpftest.ActShot, wantDrop: "fabric_unknown_host"},
		{name: "a host asks for web1 as the subnet's gateway: answered, nothing learned",
			in:          arpFrame(h2MAC, subnetMAC, 1, vmac(gw), gw, nil, web1),
			wantVerdict: bpftest.ActRedirect, want: ptr(arpFrame(h1MAC, h2MAC, 2, vmac(web1), web1, vmac(gw), gw)),
			wantTo: 7, wantForward: "arp_answered"},
	})
	if got := mappingOf(k, gw); got != "" {
		t.Errorf("a question as the gateway was learned: %s -> %s", gw, got)
	}
	if got := mappingOf(k, web2); got != h2MAC.String() {
		t.Errorf("web2 mapped to %s after other nodes' questions, want h2 (%s)", got, h2MAC)
	}
	// Doubted, though: the agent's next sweep asks where web2 is, and the
	// answer is a claim it checks against the store.
	if c, ok := confirmedOf(t, k, web2); !ok || c != 0 {
		t.Errorf("web2's entry confirmed at %d (present %v), want 0: doubted", c, ok)
	}
	if got := mappingOf(k, newVM); got != "" {
		t.Errorf("a question from a node that is no host was learned: %s -> %s", newVM, got)
	}
}

// An ARP request teaches no mapping, whatever form it takes: its sender
// address is only what the asker says, and a node on the fabric using a
// host's MAC would otherwise point a VM that lives elsewhere at itself
// (issue 20, item 13). An entry is made only by an answer to this host's own
// question (the control, first), and moved only by a claim the store backs.
func TestPrivilegedFabricARPRequestTeachesNoMapping(t *testing.T) {
	k := loadTestKernel(t)
	subnetMAC := bpftest.MustMAC("03:00:0a:01:01:00")
	far := netip.MustParseAddr("10.1.1.60")       // on h3; web1 asked for it
	elsewhere := netip.MustParseAddr("10.1.1.70") // on h3; nobody here asked
	pending := netip.MustParseAddr("10.1.1.71")   // on h3; being asked for
	seedAsking(t, k, far)
	seedAsking(t, k, pending)
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "control: h3's answer to web1's question is learned and handed to web1",
			in:          arpFrame(h3MAC, h1MAC, 2, vmac(far), far, vmac(web1), web1),
			wantVerdict: bpftest.ActRedirect, want: ptr(arpFrame(vmac(far), vmac(web1), 2, vmac(far), far, vmac(web1), web1)),
			wantTo: 1, wantPeer: true, wantForward: "arp_learned,arp_reply"},
		{name: "h2's MAC asks for web1 as a VM that lives elsewhere: answered, nothing learned",
			in:          arpFrame(h2MAC, subnetMAC, 1, vmac(elsewhere), elsewhere, nil, web1),
			wantVerdict: bpftest.ActRedirect, want: ptr(arpFrame(h1MAC, h2MAC, 2, vmac(web1), web1, vmac(elsewhere), elsewhere)),
			wantTo: 7, wantForward: "arp_answered"},
		{name: "the same, unicast to this host's uplink",
			in:          arpFrame(h2MAC, h1MAC, 1, vmac(elsewhere), elsewhere, nil, web1),
			wantVerdict: bpftest.ActRedirect, want: ptr(arpFrame(h1MAC, h2MAC, 2, vmac(web1), web1, vmac(elsewhere), elsewhere)),
			wantTo: 7, wantForward: "arp_answered"},
		{name: "a question as an address this host is asking about does not answer it",
			in:          arpFrame(h2MAC, subnetMAC, 1, vmac(pending), pending, nil, web1),
			wantVerdict: bpftest.ActRedirect, want: ptr(arpFrame(h1MAC, h2MAC, 2, vmac(web1), web1, vmac(pending), pending)),
			wantTo: 7, wantForward: "arp_answered"},
		{name: "a gratuitous request to the subnet's group teaches nothing",
			in:          arpFrame(h2MAC, subnetMAC, 1, vmac(elsewhere), elsewhere, nil, elsewhere),
			wantVerdict: bpftest.ActShot, wantDrop: "arp_not_here"},
		{name: "a gratuitous request to everyone goes to the host's stack, not the table",
			in:          arpFrame(h2MAC, layers.EthernetBroadcast, 1, vmac(elsewhere), elsewhere, nil, elsewhere),
			wantVerdict: bpftest.ActOK},
		{name: "a gratuitous reply (announcement) adds no entry",
			in:          arpFrame(h2MAC, layers.EthernetBroadcast, 2, vmac(elsewhere), elsewhere, layers.EthernetBroadcast, elsewhere),
			wantVerdict: bpftest.ActShot, wantDrop: "arp_not_here"},
	})
	if got := mappingOf(k, far); got != h3MAC.String() {
		t.Errorf("the control's answer: %s mapped to %q, want h3 (%s)", far, got, h3MAC)
	}
	for _, ip := range []netip.Addr{elsewhere, pending} {
		if got := mappingOf(k, ip); got != "" {
			t.Errorf("an ARP request taught %s -> %s: its traffic would go to whoever used that MAC", ip, got)
		}
	}
	// Still being asked for: the answer from the VM's host fills it.
	var m Mapping
	if err := k.vif.Mappings.Lookup(IPKey(pending), &m); err != nil {
		t.Errorf("%s's question was lost: %v", pending, err)
	}
}

func TestPrivilegedOnlyTheStoreMovesAMappingAHostClaims(t *testing.T) {
	k := loadTestKernel(t)
	r, err := k.SlowPath()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	stranger := netip.MustParseAddr("10.1.1.71")
	tcp := layers.IPProtocolTCP
	announce := arpFrame(h3MAC, layers.EthernetBroadcast, 2, vmac(web2), web2, layers.EthernetBroadcast, web2)
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "h3 announces web2, mapped to h2: the agent is asked, the entry stays",
			in: announce, wantVerdict: bpftest.ActShot, wantForward: "to_agent"},
		{name: "the same claim within a second costs the agent nothing",
			in: announce, wantVerdict: bpftest.ActShot, wantDrop: "claim_limited"},
		{name: "h3 answers this host about db1, mapped to h2: the agent is asked",
			in:          arpFrame(h3MAC, h1MAC, 2, vmac(db1), db1, h1MAC, netip.MustParseAddr("192.168.100.10")),
			wantVerdict: bpftest.ActShot, wantForward: "to_agent"},
		{name: "an answer nobody here asked for is refused and adds nothing",
			in:          arpFrame(h3MAC, h1MAC, 2, vmac(stranger), stranger, vmac(web1), web1),
			wantVerdict: bpftest.ActShot, wantDrop: "arp_unsolicited"},
		{name: "a node that is no host announcing web2 is refused",
			in:          arpFrame(rogueMAC, layers.EthernetBroadcast, 2, vmac(web2), web2, layers.EthernetBroadcast, web2),
			wantVerdict: bpftest.ActShot, wantDrop: "fabric_unknown_host"},
	})
	for _, ip := range []netip.Addr{web2, db1} {
		if got := mappingOf(k, ip); got != h2MAC.String() {
			t.Errorf("%s mapped to %s after h3's claim, want h2 (%s) until the store agrees", ip, got, h2MAC)
		}
	}
	if got := mappingOf(k, stranger); got != "" {
		t.Errorf("an unsolicited answer was learned: %s -> %s", stranger, got)
	}
	// The agent gets each claim whole, to check it against the store.
	for _, want := range []frame{announce,
		arpFrame(h3MAC, h1MAC, 2, vmac(db1), db1, h1MAC, netip.MustParseAddr("192.168.100.10"))} {
		rec := readSlowPath(t, r)
		if rec.kind != 3 || !bytes.Equal(rec.data, want.bytes(t)) {
			t.Fatalf("slow-path record kind %d\n got %x\nwant kind 3 (claim), %x", rec.kind, rec.data, want.bytes(t))
		}
	}
	// The store places web2 on h3 (a move): the agent points the entry.
	if err := k.PointMapping(web2, h3MAC, uint64(monotonicNow())); err != nil {
		t.Fatal(err)
	}
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "then web2's traffic comes from h3",
			in:          frame{Src: h3MAC, Dst: h1MAC, Saddr: web2, Daddr: web1, Proto: tcp},
			wantVerdict: bpftest.ActRedirect, want: &frame{Src: vmac(web2), Dst: vmac(web1), Saddr: web2, Daddr: web1, Proto: tcp},
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
		{name: "and no longer from h2",
			in:          frame{Src: h2MAC, Dst: h1MAC, Saddr: web2, Daddr: web1, Proto: tcp},
			wantVerdict: bpftest.ActShot, wantDrop: "fabric_unknown_src"},
	})
}

func TestPrivilegedTenantSpaceFromTheFabricOnlyFromKnownHostsWithTenantSources(t *testing.T) {
	k := loadTestKernel(t)
	icmp, udp := layers.IPProtocolICMPv4, layers.IPProtocolUDP
	newVM := netip.MustParseAddr("10.1.1.70")
	// 192.1.2.7 reads as farm 1, subnet 2 (blue/db) to a check that looks
	// only at the middle bytes, and db may ping web.
	outside := netip.MustParseAddr("192.1.2.7")
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "a node that is no host sends as a VM new to the table",
			in:          frame{Src: rogueMAC, Dst: h1MAC, Saddr: newVM, Daddr: web1, Proto: udp},
			wantVerdict: bpftest.ActShot, wantDrop: "fabric_unknown_host"},
		{name: "a node that is no host sends as web2",
			in:          frame{Src: rogueMAC, Dst: h1MAC, Saddr: web2, Daddr: web1, Proto: udp},
			wantVerdict: bpftest.ActShot, wantDrop: "fabric_unknown_host"},
		{name: "a host sends from outside the tenant space",
			in:          frame{Src: h2MAC, Dst: h1MAC, Saddr: outside, Daddr: web1, Proto: icmp},
			wantVerdict: bpftest.ActShot, wantDrop: "fabric_not_tenant"},
		{name: "a host sends as the subnet's gateway",
			in:          frame{Src: h2MAC, Dst: h1MAC, Saddr: gw, Daddr: web1, Proto: udp},
			wantVerdict: bpftest.ActShot, wantDrop: "fabric_not_tenant"},
		{name: "a host sends as the subnet's broadcast address",
			in:          frame{Src: h2MAC, Dst: h1MAC, Saddr: netip.MustParseAddr("10.1.1.255"), Daddr: web1, Proto: udp},
			wantVerdict: bpftest.ActShot, wantDrop: "fabric_not_tenant"},
		{name: "a known host with a VM new to the table is heard, and learned",
			in:          frame{Src: h3MAC, Dst: h1MAC, Saddr: newVM, Daddr: web1, Proto: udp},
			wantVerdict: bpftest.ActRedirect, want: &frame{Src: vmac(newVM), Dst: vmac(web1), Saddr: newVM, Daddr: web1, Proto: udp},
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
	})
	if got := mappingOf(k, newVM); got != h3MAC.String() {
		t.Errorf("%s mapped to %q, want h3 (%s): the node that is no host must not have been learned", newVM, got, h3MAC)
	}
}

func TestPrivilegedFabricBroadcastIsOnlyABroadcastOfItsScopeFromAKnownHost(t *testing.T) {
	k := loadTestKernel(t)
	udp := layers.IPProtocolUDP
	subnetMAC, farmMAC := bpftest.MustMAC("03:00:0a:01:01:00"), bpftest.MustMAC("03:00:0a:01:00:00")
	newVM := netip.MustParseAddr("10.1.1.70")
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "unicast to web1 sent to the subnet's multicast MAC",
			in:          frame{Src: h2MAC, Dst: subnetMAC, Saddr: web2, Daddr: web1, Proto: udp},
			wantVerdict: bpftest.ActShot, wantDrop: "fabric_not_broadcast"},
		{name: "another subnet's broadcast sent to this subnet's multicast MAC",
			in:          frame{Src: h2MAC, Dst: subnetMAC, Saddr: web2, Daddr: netip.MustParseAddr("10.1.2.255"), Proto: udp},
			wantVerdict: bpftest.ActShot, wantDrop: "fabric_not_broadcast"},
		{name: "subnet-scoped multicast (ttl 1) sent to the farm's multicast MAC",
			in:          frame{Src: h2MAC, Dst: farmMAC, Saddr: web2, Daddr: netip.MustParseAddr("239.1.2.3"), Proto: udp, TTL: 1},
			wantVerdict: bpftest.ActShot, wantDrop: "fabric_not_broadcast"},
		{name: "a node that is no host broadcasts as a new VM of the subnet",
			in:          frame{Src: rogueMAC, Dst: subnetMAC, Saddr: newVM, Daddr: netip.MustParseAddr("10.1.1.255"), Proto: udp},
			wantVerdict: bpftest.ActShot, wantDrop: "fabric_unknown_host"},
		{name: "a host broadcasts from outside the tenant space",
			in:          frame{Src: h2MAC, Dst: subnetMAC, Saddr: netip.MustParseAddr("192.1.1.9"), Daddr: netip.MustParseAddr("255.255.255.255"), Proto: udp},
			wantVerdict: bpftest.ActShot, wantDrop: "fabric_not_tenant"},
		{name: "web2's real subnet broadcast still reaches web1 and web3",
			in:          frame{Src: h2MAC, Dst: subnetMAC, Saddr: web2, Daddr: netip.MustParseAddr("10.1.1.255"), Proto: udp},
			wantVerdict: bpftest.ActShot, wantClones: []uint32{1, 42}, wantForward: "broadcast"},
	})
	if got := mappingOf(k, newVM); got != "" {
		t.Errorf("a broadcast from a node that is no host was learned: %s -> %s", newVM, got)
	}
}

func TestPrivilegedFabricARPReplyReachesAVMOnlyForItsSubnet(t *testing.T) {
	k := loadTestKernel(t)
	db20 := netip.MustParseAddr("10.1.2.20")
	seedAsking(t, k, db20) // asked for (by the agent, for a held packet)
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "an answer about another subnet's VM addressed to web1",
			in:          arpFrame(h2MAC, h1MAC, 2, vmac(db20), db20, vmac(web1), web1),
			wantVerdict: bpftest.ActShot, wantDrop: "arp_other_subnet"},
	})
	if got := mappingOf(k, db20); got != "" {
		t.Errorf("the refused answer was learned: %s -> %s", db20, got)
	}
}

// A host that leaves the store leaves the hosts map, and the entries that
// point at it go with it: a frame that matches its entry is believed
// without asking the hosts map.
func TestPrivilegedAHostThatLeavesTheStoreTakesItsMappingsAlong(t *testing.T) {
	k := loadTestKernel(t)
	seedMapping(t, k, netip.MustParseAddr("10.1.1.80"), h3MAC)
	e := compileTest(t, testDesired(), testIfindex)
	delete(e.Hosts, hostKey(h2MAC))
	if err := k.Apply(e, ""); err != nil {
		t.Fatal(err)
	}
	for ip, want := range map[netip.Addr]string{web2: "", db1: "", netip.MustParseAddr("10.1.1.80"): h3MAC.String()} {
		if got := mappingOf(k, ip); got != want {
			t.Errorf("mapping of %s = %q, want %q", ip, got, want)
		}
	}
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "h2, gone from the store, is not heard",
			in:          frame{Src: h2MAC, Dst: h1MAC, Saddr: web2, Daddr: web1, Proto: layers.IPProtocolUDP},
			wantVerdict: bpftest.ActShot, wantDrop: "fabric_unknown_host"},
	})
}
