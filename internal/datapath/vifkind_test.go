package datapath

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/intent"
)

// db3 is a VM of h1 in another subnet than web1 (10.1.2.0/24), on
// ifindex 43: the target of a routed local delivery.
var db3 = netip.MustParseAddr("10.1.2.5")

// loadKindKernel loads h1's maps as its agent writes them (testDesired
// plus db3), with web3 and db3 on vifs of kind kind; web1, the vif the
// rows send from (loopback, ifindex 1, the one device BPF_PROG_RUN runs
// on), is a veth.
func loadKindKernel(t *testing.T, kind VifKind) *Kernel {
	return loadKindsKernel(t, VifVeth, kind)
}

// loadKindsKernel is loadKindKernel with web1's vif of kind sender.
func loadKindsKernel(t *testing.T, sender, kind VifKind) *Kernel {
	t.Helper()
	d := testDesired()
	d.Local = append(d.Local, intent.LocalEndpoint{Name: "blue/db/db3", IP: db3.String(), MAC: vmac(db3).String(), Interface: "tap-db3"})
	vifOf := func(name string) (Vif, error) {
		switch name {
		case "vif-web1":
			return Vif{Ifindex: 1, Kind: sender}, nil
		case "vif-web3":
			return Vif{Ifindex: 42, Kind: kind}, nil
		case "tap-db3":
			return Vif{Ifindex: 43, Kind: kind}, nil
		}
		return Vif{}, os.ErrNotExist
	}
	e, missing, refused, err := CompileVifs(d, h1Uplink, vifOf)
	if err != nil || len(missing) != 0 || len(refused) != 0 {
		t.Fatalf("compile: %v (missing %v, refused %v)", err, missing, refused)
	}
	if e.Endpoints[IPKey(web3)].Kind != uint8(kind) || e.Vifs[42].Kind != uint8(kind) {
		t.Fatalf("web3's endpoint and vif entries say kinds %d and %d, want %d", e.Endpoints[IPKey(web3)].Kind, e.Vifs[42].Kind, kind)
	}
	if e.Hosts, err = CompileHosts(testNodes, "h1"); err != nil {
		t.Fatal(err)
	}
	e.Attach = nil
	k := openTestKernel(t, Options{testHooks: true})
	if err := k.Apply(e, ""); err != nil {
		t.Fatalf("apply: %v", err)
	}
	seedMapping(t, k, web2, h2MAC)
	seedMapping(t, k, db1, h2MAC)
	return k
}

// Every delivery to a guest, on a guest behind a tap: out of the tap (its
// reader, QEMU, takes the frame), never bpf_redirect_peer (a tap has no
// peer); behind a macvtap: into its ingress (its egress would send the
// frame out of the lower device), copies too; and the same rows on veths
// still go into the peer.
func TestPrivilegedEveryDeliveryToAGuestFollowsItsVifKind(t *testing.T) {
	tcp, udp := layers.IPProtocolTCP, layers.IPProtocolUDP
	far := netip.MustParseAddr("10.1.1.60") // a VM on h2 that web3 asked for
	dbGW := vmac(netip.MustParseAddr("10.1.2.1"))
	for _, kind := range []VifKind{VifVeth, VifTap, VifMacvtap} {
		t.Run(VifKindName(kind), func(t *testing.T) {
			k := loadKindKernel(t, kind)
			peer, in := kind == VifVeth, kind == VifMacvtap
			// A copy to web3: out of its vif, or into a macvtap.
			clones, clonesIn := []uint32{42}, []uint32(nil)
			fabricClones, fabricClonesIn := []uint32{1, 42}, []uint32(nil)
			if in {
				clones, clonesIn = nil, []uint32{42}
				fabricClones, fabricClonesIn = []uint32{1}, []uint32{42}
			}
			seedAsking(t, k, far)
			runTable(t, k, k.VifProgram(), []progCase{
				{name: "intra-subnet to a local VM",
					in:          frame{Src: vmac(web1), Dst: vmac(web3), Saddr: web1, Daddr: web3, Proto: tcp},
					wantVerdict: bpftest.ActRedirect, want: &frame{Src: vmac(web1), Dst: vmac(web3), Saddr: web1, Daddr: web3, Proto: tcp},
					wantTo: 42, wantPeer: peer, wantIn: in, wantForward: "local"},
				{name: "routed to a local VM of another subnet, from its gateway",
					in:          frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db3, Proto: tcp, Dport: 5432},
					wantVerdict: bpftest.ActRedirect, want: &frame{Src: dbGW, Dst: vmac(db3), Saddr: web1, Daddr: db3, Proto: tcp, Dport: 5432, TTL: 63},
					wantTo: 43, wantPeer: peer, wantIn: in, wantForward: "local,routed"},
				{name: "a subnet broadcast is copied to the local member by its vif",
					in:          frame{Src: vmac(web1), Dst: layers.EthernetBroadcast, Saddr: web1, Daddr: netip.MustParseAddr("10.1.1.255"), Proto: udp},
					wantVerdict: bpftest.ActRedirect, want: &frame{Src: h1MAC, Dst: bpftest.MustMAC("03:00:0a:01:01:00"), Saddr: web1, Daddr: netip.MustParseAddr("10.1.1.255"), Proto: udp},
					wantTo: 7, wantClones: clones, wantClonesIn: clonesIn, wantForward: "to_fabric"},
			})
			runTable(t, k, k.UplinkProgram(), []progCase{
				{name: "from the fabric to a local VM",
					in:          frame{Src: h2MAC, Dst: h1MAC, Saddr: web2, Daddr: web3, Proto: tcp},
					wantVerdict: bpftest.ActRedirect, want: &frame{Src: vmac(web2), Dst: vmac(web3), Saddr: web2, Daddr: web3, Proto: tcp},
					wantTo: 42, wantPeer: peer, wantIn: in, wantForward: "from_fabric"},
				{name: "the ARP answer a local VM waited for",
					in:          arpFrame(h2MAC, h1MAC, 2, vmac(far), far, vmac(web3), web3),
					wantVerdict: bpftest.ActRedirect, want: ptr(arpFrame(vmac(far), vmac(web3), 2, vmac(far), far, vmac(web3), web3)),
					wantTo: 42, wantPeer: peer, wantIn: in, wantForward: "arp_learned,arp_reply"},
				{name: "a subnet broadcast from the fabric is copied to every local member",
					in:          frame{Src: h2MAC, Dst: bpftest.MustMAC("03:00:0a:01:01:00"), Saddr: web2, Daddr: netip.MustParseAddr("10.1.1.255"), Proto: udp},
					wantVerdict: bpftest.ActShot, wantClones: fabricClones, wantClonesIn: fabricClonesIn, wantForward: "broadcast"},
			})
		})
	}
}

// A macvtap guest's frames are judged on the macvtap's egress, and from
// there every delivery is one that works on egress: a veth is reached out
// of its host end (bpf_redirect_peer drops on egress), a tap out of it,
// the fabric out of the uplink; and the replies the datapath makes to the
// sender (its gateway, proxy ARP, time-exceeded) go into the macvtap,
// since out of it is the wire (a proxy ARP answer goes back out of it,
// marked, and into it on the program's second pass). Anti-spoofing is as
// for any guest.
func TestPrivilegedAMacvtapGuestIsJudgedOnItsEgressAndAnsweredIntoItsIngress(t *testing.T) {
	k := loadKindsKernel(t, VifMacvtap, VifVeth)
	if err := k.vif.Endpoints.Update(IPKey(db3), Endpoint{Ifindex: 43, Mac: [6]byte(vmac(db3)), Kind: uint8(VifTap)}, 0); err != nil {
		t.Fatal(err) // db3 a tap, web3 a veth
	}
	tcp, udp, icmp := layers.IPProtocolTCP, layers.IPProtocolUDP, layers.IPProtocolICMPv4
	dbGW := vmac(netip.MustParseAddr("10.1.2.1"))
	expired := frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: tcp, Dport: 5432, TTL: 1}
	arpRequest := frame{Src: vmac(web1), Dst: layers.EthernetBroadcast, EtherType: layers.EthernetTypeARP, Saddr: web1, Daddr: web2, ARPOp: 1}
	svc := frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: netip.MustParseAddr("169.254.20.31"), Proto: tcp, Dport: 2031}
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "to a local veth VM, out of its host end",
			in:          frame{Src: vmac(web1), Dst: vmac(web3), Saddr: web1, Daddr: web3, Proto: tcp},
			wantVerdict: bpftest.ActRedirect, want: &frame{Src: vmac(web1), Dst: vmac(web3), Saddr: web1, Daddr: web3, Proto: tcp},
			wantTo: 42, wantForward: "local"},
		{name: "routed to a local tap VM, out of the tap",
			in:          frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db3, Proto: tcp, Dport: 5432},
			wantVerdict: bpftest.ActRedirect, want: &frame{Src: dbGW, Dst: vmac(db3), Saddr: web1, Daddr: db3, Proto: tcp, Dport: 5432, TTL: 63},
			wantTo: 43, wantForward: "local,routed"},
		{name: "to a VM on another host, out of the uplink",
			in:          frame{Src: vmac(web1), Dst: vmac(web2), Saddr: web1, Daddr: web2, Proto: udp},
			wantVerdict: bpftest.ActRedirect, want: &frame{Src: h1MAC, Dst: h2MAC, Saddr: web1, Daddr: web2, Proto: udp},
			wantTo: 7, wantForward: "to_fabric"},
		{name: "ping to the gateway is answered into the macvtap",
			in:          frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: gw, Proto: icmp},
			wantVerdict: bpftest.ActRedirect, want: &frame{Src: vmac(gw), Dst: vmac(web1), Saddr: gw, Daddr: web1, Proto: icmp, ICMPType: 100},
			wantTo: 1, wantIn: true, wantForward: "gateway_reply"},
		{name: "arp for a VM of the subnet is answered back out of the macvtap, marked (the mark is checked below)",
			in:          arpRequest,
			wantVerdict: bpftest.ActRedirect,
			want:        &frame{Src: vmac(web2), Dst: vmac(web1), EtherType: layers.EthernetTypeARP, Saddr: web2, Daddr: web1, ARPOp: 2, ARPTHA: vmac(web1)},
			wantTo:      1, wantForward: "arp_reply"},
		{name: "ttl 1 at the gateway hop: the time-exceeded goes into the macvtap",
			in: expired, wantVerdict: bpftest.ActRedirect, wantBytes: timeExceeded(t, expired), wantTo: 1, wantIn: true, wantForward: "gateway_reply"},
		{name: "a spoofed source is dropped as from any guest",
			in: frame{Src: vmac(web1), Dst: vmac(web2), Saddr: web3, Daddr: web2, Proto: udp}, wantVerdict: bpftest.ActShot, wantDrop: "spoofed_ip"},
		{name: "a spoofed MAC too",
			in: frame{Src: vmac(web3), Dst: vmac(web2), Saddr: web1, Daddr: web2, Proto: udp}, wantVerdict: bpftest.ActShot, wantDrop: "spoofed_mac"},
	})
	// Passed on (TC_ACT_OK) on a macvtap's egress, the frame would leave by
	// its lower device, not reach the host's stack.
	if err := k.SetFeatures(FeatureVNATLocation); err != nil {
		t.Fatal(err)
	}
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "the VNAT location service is out of a macvtap guest's reach", in: svc, wantVerdict: bpftest.ActShot, wantDrop: "macvtap_no_stack"},
	})
}

// runMarked runs prog on in with the skb's mark set to mark (BPF_PROG_RUN's
// __sk_buff context: len, pkt_type, then mark), returning the verdict, the
// mark the program left and the one redirect it made (To 0: none).
func runMarked(t *testing.T, prog *ebpf.Program, in []byte, mark uint32) (verdict, markOut uint32, to bpftest.Redirect) {
	t.Helper()
	log := bpftest.OpenRedirectLog(t, prog)
	log.Reset(t)
	verdict, markOut = runWithMark(t, prog, in, mark)
	for _, r := range log.Read(t) {
		if r.Kind != bpftest.RedirectClone && r.Kind != bpftest.RedirectCloneIn {
			to = r
		}
	}
	return verdict, markOut, to
}

// runWithMark is runMarked for a program that redirects nothing (the
// guard, which has no redirect log).
func runWithMark(t *testing.T, prog *ebpf.Program, in []byte, mark uint32) (verdict, markOut uint32) {
	t.Helper()
	// Larger than struct __sk_buff: the kernel copies back what it has.
	ctxIn, ctxOut := make([]byte, 256), make([]byte, 256)
	binary.NativeEndian.PutUint32(ctxIn[8:], mark)
	ret, err := prog.Run(&ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+256), Context: ctxIn, ContextOut: ctxOut})
	if err != nil {
		t.Fatalf("BPF_PROG_RUN: %v", err)
	}
	return ret, binary.NativeEndian.Uint32(ctxOut[8:])
}

// The mark is the whole of a macvtap guest's isolation: a frame the
// datapath delivers into a macvtap carries it, one into a veth or a tap
// does not need it; the agent's own marked frame out of a macvtap (a DHCP
// answer, or the program's own proxy ARP answer) is turned into the guest;
// and the guard on the macvtap's
// ingress passes a marked frame (clearing the mark) and drops and counts
// anything else, which is what the lower device's macvlan path hands it.
func TestPrivilegedTheGuestMarkCarriesDeliveriesIntoAMacvtapAndTheGuardPassesNothingElse(t *testing.T) {
	tcp := layers.IPProtocolTCP
	toWeb3 := frame{Src: vmac(web1), Dst: vmac(web3), Saddr: web1, Daddr: web3, Proto: tcp}.bytes(t)
	for _, c := range []struct {
		kind     VifKind
		wantMark uint32
		wantKind bpftest.RedirectKind
	}{{VifVeth, 0, bpftest.RedirectPeer}, {VifTap, 0, bpftest.RedirectOut}, {VifMacvtap, GuestMark, bpftest.RedirectIn}} {
		k := loadKindKernel(t, c.kind)
		verdict, mark, to := runMarked(t, k.VifProgram(), toWeb3, 0)
		if verdict != bpftest.ActRedirect || to != (bpftest.Redirect{Ifindex: 42, Kind: c.wantKind}) || mark != c.wantMark {
			t.Errorf("web1 to web3 on a %s: verdict %d, %+v, mark %#x; want a redirect %s to 42, mark %#x",
				VifKindName(c.kind), verdict, to, mark, c.wantKind, c.wantMark)
		}
	}

	k := loadKindsKernel(t, VifMacvtap, VifVeth)
	// What the agent sends web1: from its gateway, which web1 could never
	// send as.
	offer := frame{Src: vmac(gw), Dst: vmac(web1), Saddr: gw, Daddr: web1, Proto: layers.IPProtocolUDP, Sport: 67, Dport: 68}.bytes(t)
	verdict, mark, to := runMarked(t, k.VifProgram(), offer, GuestMark)
	if verdict != bpftest.ActRedirect || to != (bpftest.Redirect{Ifindex: 1, Kind: bpftest.RedirectIn}) || mark != GuestMark {
		t.Errorf("the agent's marked frame on the macvtap's egress: verdict %d, %+v, mark %#x; want into ifindex 1, marked", verdict, to, mark)
	}
	// A proxy ARP answer goes back out of the macvtap, marked: the program
	// takes it in on a second pass (the row above).
	arp := frame{Src: vmac(web1), Dst: layers.EthernetBroadcast, EtherType: layers.EthernetTypeARP, Saddr: web1, Daddr: web2, ARPOp: 1}.bytes(t)
	verdict, mark, to = runMarked(t, k.VifProgram(), arp, 0)
	if verdict != bpftest.ActRedirect || to != (bpftest.Redirect{Ifindex: 1, Kind: bpftest.RedirectOut}) || mark != GuestMark {
		t.Errorf("a proxy ARP answer on a macvtap: verdict %d, %+v, mark %#x; want out of ifindex 1, marked", verdict, to, mark)
	}
	counters := func() bpftest.Counters {
		c, err := k.Counters()
		if err != nil {
			t.Fatal(err)
		}
		return bpftest.Counters{}.Add("drop", c.Drops).Add("forward", c.Forwards)
	}
	before := counters()
	verdict, _, _ = runMarked(t, k.VifProgram(), offer, 0)
	if verdict != bpftest.ActShot {
		t.Errorf("the same frame unmarked (the guest's own): verdict %d, want dropped", verdict)
	}
	bpftest.CheckDelta(t, before, counters(), bpftest.Counters{"drop spoofed_mac": 1})

	guard := k.MacvtapGuard()
	before = counters()
	verdict, mark = runWithMark(t, guard, toWeb3, GuestMark)
	if verdict != bpftest.ActOK || mark != 0 {
		t.Errorf("guard, marked frame: verdict %d, mark %#x; want passed, mark cleared", verdict, mark)
	}
	bpftest.CheckDelta(t, before, counters(), nil)
	for _, m := range []uint32{0, GuestMark ^ 1, 1} {
		before = counters()
		verdict, _ = runWithMark(t, guard, toWeb3, m)
		if verdict != bpftest.ActShot {
			t.Errorf("guard, frame with mark %#x: verdict %d, want dropped", m, verdict)
		}
		bpftest.CheckDelta(t, before, counters(), bpftest.Counters{"drop macvtap_bypass": 1})
	}
}

func TestVifKindOfRefusesWhatNoGuestIsOn(t *testing.T) {
	for _, c := range []struct {
		link string
		want VifKind
		ok   bool
	}{{"veth", VifVeth, true}, {"tap", VifTap, true}, {"macvtap", VifMacvtap, true}, {"tun", 0, false}, {"macvlan", 0, false}, {"bridge", 0, false}, {"", 0, false}} {
		got, err := VifKindOf(c.link)
		if c.ok && (err != nil || got != c.want) {
			t.Errorf("VifKindOf(%q) = %v, %v; want %v", c.link, got, err, c.want)
		}
		if !c.ok && !errors.Is(err, ErrNotGuestLink) {
			t.Errorf("VifKindOf(%q): error %v, want one wrapping ErrNotGuestLink", c.link, err)
		}
	}
}

// A refused interface leaves its VM out of every table, reported apart
// from the interfaces that are not there yet.
func TestCompileVifsLeavesRefusedInterfacesOut(t *testing.T) {
	vifOf := func(name string) (Vif, error) {
		switch name {
		case "vif-web1":
			return Vif{Ifindex: 1, Kind: VifVeth}, nil
		case "vif-web3":
			_, err := VifKindOf("bridge")
			return Vif{}, err
		}
		return Vif{}, os.ErrNotExist
	}
	e, missing, refused, err := CompileVifs(testDesired(), h1Uplink, vifOf)
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) != 0 || len(refused) != 1 || refused["vif-web3"] == "" {
		t.Fatalf("missing %v, refused %v; want only vif-web3 refused", missing, refused)
	}
	if _, ok := e.Endpoints[IPKey(web3)]; ok || len(e.Vifs) != 1 || len(e.Attach) != 1 {
		t.Errorf("web3 is in the tables: endpoints %v, vifs %v, attach %v", e.Endpoints, e.Vifs, e.Attach)
	}
}
