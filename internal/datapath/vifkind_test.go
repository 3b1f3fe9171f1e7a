package datapath

import (
	"errors"
	"net/netip"
	"os"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/intent"
)

// db3 is a VM of h1 in another subnet than web1 (10.1.2.0/24), on
// ifindex 43: the target of a routed local delivery.
var db3 = netip.MustParseAddr("10.1.2.5")

// loadKindKernel loads h1's maps as its agent writes them (testDesired
// plus db3), with web3 and db3 on vifs of kind kind; web1, the vif the
// rows send from, stays a veth on loopback.
func loadKindKernel(t *testing.T, kind VifKind) *Kernel {
	t.Helper()
	d := testDesired()
	d.Local = append(d.Local, intent.LocalEndpoint{Name: "blue/db/db3", IP: db3.String(), MAC: vmac(db3).String(), Interface: "tap-db3"})
	vifOf := func(name string) (Vif, error) {
		switch name {
		case "vif-web1":
			return Vif{Ifindex: 1, Kind: VifVeth}, nil
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
// peer); and the same rows on veths still go into the peer.
func TestPrivilegedEveryDeliveryToAGuestFollowsItsVifKind(t *testing.T) {
	tcp, udp := layers.IPProtocolTCP, layers.IPProtocolUDP
	far := netip.MustParseAddr("10.1.1.60") // a VM on h2 that web3 asked for
	dbGW := vmac(netip.MustParseAddr("10.1.2.1"))
	for _, kind := range []VifKind{VifVeth, VifTap} {
		t.Run(VifKindName(kind), func(t *testing.T) {
			k := loadKindKernel(t, kind)
			peer := kind == VifVeth
			seedAsking(t, k, far)
			runTable(t, k, k.VifProgram(), []progCase{
				{name: "intra-subnet to a local VM",
					in:          frame{Src: vmac(web1), Dst: vmac(web3), Saddr: web1, Daddr: web3, Proto: tcp},
					wantVerdict: bpftest.ActRedirect, want: &frame{Src: vmac(web1), Dst: vmac(web3), Saddr: web1, Daddr: web3, Proto: tcp},
					wantTo: 42, wantPeer: peer, wantForward: "local"},
				{name: "routed to a local VM of another subnet, from its gateway",
					in:          frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db3, Proto: tcp, Dport: 5432},
					wantVerdict: bpftest.ActRedirect, want: &frame{Src: dbGW, Dst: vmac(db3), Saddr: web1, Daddr: db3, Proto: tcp, Dport: 5432, TTL: 63},
					wantTo: 43, wantPeer: peer, wantForward: "local,routed"},
				{name: "a subnet broadcast is copied to the local member out of its vif",
					in:          frame{Src: vmac(web1), Dst: layers.EthernetBroadcast, Saddr: web1, Daddr: netip.MustParseAddr("10.1.1.255"), Proto: udp},
					wantVerdict: bpftest.ActRedirect, want: &frame{Src: h1MAC, Dst: bpftest.MustMAC("03:00:0a:01:01:00"), Saddr: web1, Daddr: netip.MustParseAddr("10.1.1.255"), Proto: udp},
					wantTo: 7, wantClones: []uint32{42}, wantForward: "to_fabric"},
			})
			runTable(t, k, k.UplinkProgram(), []progCase{
				{name: "from the fabric to a local VM",
					in:          frame{Src: h2MAC, Dst: h1MAC, Saddr: web2, Daddr: web3, Proto: tcp},
					wantVerdict: bpftest.ActRedirect, want: &frame{Src: vmac(web2), Dst: vmac(web3), Saddr: web2, Daddr: web3, Proto: tcp},
					wantTo: 42, wantPeer: peer, wantForward: "from_fabric"},
				{name: "the ARP answer a local VM waited for",
					in:          arpFrame(h2MAC, h1MAC, 2, vmac(far), far, vmac(web3), web3),
					wantVerdict: bpftest.ActRedirect, want: ptr(arpFrame(vmac(far), vmac(web3), 2, vmac(far), far, vmac(web3), web3)),
					wantTo: 42, wantPeer: peer, wantForward: "arp_learned,arp_reply"},
				{name: "a subnet broadcast from the fabric is copied to every local member",
					in:          frame{Src: h2MAC, Dst: bpftest.MustMAC("03:00:0a:01:01:00"), Saddr: web2, Daddr: netip.MustParseAddr("10.1.1.255"), Proto: udp},
					wantVerdict: bpftest.ActShot, wantClones: []uint32{1, 42}, wantForward: "broadcast"},
			})
		})
	}
}

func TestVifKindOfRefusesWhatNoGuestIsOn(t *testing.T) {
	for _, c := range []struct {
		link string
		want VifKind
		ok   bool
	}{{"veth", VifVeth, true}, {"tap", VifTap, true}, {"tun", 0, false}, {"macvtap", 0, false}, {"bridge", 0, false}, {"", 0, false}} {
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
