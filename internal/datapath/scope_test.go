package datapath

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/limits"
)

// manyInOneSubnet is a host with n VMs of blue/web and one VM of red/web.
func manyInOneSubnet(n int) intent.Desired {
	d := intent.Desired{Node: "h1", VMNet: "10.0.0.0/8"}
	for i := 0; i < n; i++ {
		ip := netip.AddrFrom4([4]byte{10, 1, 1, byte(2 + i)})
		d.Local = append(d.Local, intent.LocalEndpoint{Name: fmt.Sprintf("blue/web/vm%d", i), IP: ip.String(),
			MAC: vmac(ip).String(), Interface: fmt.Sprintf("vif-vm%d", i)})
	}
	red := netip.MustParseAddr("10.2.1.2")
	d.Local = append(d.Local, intent.LocalEndpoint{Name: "red/web/red1", IP: red.String(), MAC: vmac(red).String(), Interface: "vif-red1"})
	return d
}

// Every vif is loopback (ifindex 1) to BPF_PROG_RUN, the one device each
// copy can really be cloned to, so each member's copy is counted.
func allOnLoopback(string) (int, error) { return 1, nil }

func TestCompileHasNoSmallLimitOfVMsPerSubnet(t *testing.T) {
	n := 40 // more than the 32 a scope held before
	e, missing, err := Compile(manyInOneSubnet(n), h1Uplink, func(name string) (int, error) {
		var i int
		if _, err := fmt.Sscanf(name, "vif-vm%d", &i); err == nil {
			return 100 + i, nil
		}
		return 99, nil
	})
	if err != nil || len(missing) != 0 {
		t.Fatalf("compile %d VMs of one subnet: %v (missing %v)", n, err, missing)
	}
	subnet, farm := ScopeKey{Farm: 1, Subnet: 1}, ScopeKey{Farm: 1}
	if e.Scopes[subnet].Count != uint32(n) || e.Scopes[farm].Count != uint32(n) || e.Scopes[ScopeKey{Farm: 2, Subnet: 1}].Count != 1 {
		t.Fatalf("scopes %+v", e.Scopes)
	}
	for i := 0; i < n; i++ {
		m, ok := e.Members[MemberKey{Farm: 1, Subnet: 1, Index: uint32(i)}]
		if !ok || m.Ifindex != uint32(100+i) || KeyIP(m.Ip) != netip.AddrFrom4([4]byte{10, 1, 1, byte(2 + i)}) {
			t.Fatalf("member %d of blue/web: %+v (present %v)", i, m, ok)
		}
	}
	if got := len(e.Members); got != 2*n+2 {
		t.Fatalf("%d member entries, want %d (each VM in its subnet and its farm)", got, 2*n+2)
	}
}

func TestCompileFillsAHostToItsEndpointCapacity(t *testing.T) {
	d := intent.Desired{Node: "h1", VMNet: "10.0.0.0/8"}
	for i := 0; i < limits.MaxVMsPerHost; i++ {
		ip := netip.AddrFrom4([4]byte{10, 1, byte(1 + i/250), byte(2 + i%250)})
		d.Local = append(d.Local, intent.LocalEndpoint{Name: fmt.Sprint(i), IP: ip.String(), MAC: vmac(ip).String(), Interface: fmt.Sprint("v", i)})
	}
	next := 1
	e, _, err := Compile(d, h1Uplink, func(string) (int, error) { next++; return next, nil })
	if err != nil {
		t.Fatal(err)
	}
	s := e.Sizes()
	if s["endpoints"] != limits.MaxVMsPerHost || s["scope_members"] != limits.MaxScopeMembers || s["scopes"] > limits.MaxScopes {
		t.Fatalf("sizes %v for a full host", s)
	}
}

func TestPrivilegedBroadcastReachesEveryMemberOfALargeSubnet(t *testing.T) {
	const n = 40
	k := loadTestKernelWithIfindex(t, manyInOneSubnet(n), allOnLoopback)
	udp := layers.IPProtocolUDP
	bcast := netip.MustParseAddr("10.1.1.255")
	copies := func(prog *ebpf.Program, f frame) uint64 {
		t.Helper()
		before, err := k.Counters()
		if err != nil {
			t.Fatal(err)
		}
		in := f.bytes(t)
		if _, err := prog.Run(&ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+64)}); err != nil {
			t.Fatal(err)
		}
		after, err := k.Counters()
		if err != nil {
			t.Fatal(err)
		}
		return after.Forwards["broadcast"] - before.Forwards["broadcast"]
	}
	remote := netip.MustParseAddr("10.1.1.200") // a VM of blue/web on h2
	if got := copies(k.UplinkProgram(), frame{Src: h2MAC, Dst: bpftest.MustMAC("03:00:0a:01:01:00"), Saddr: remote, Daddr: bcast, Proto: udp}); got != n {
		t.Fatalf("a subnet broadcast from the fabric made %d copies, want one for each of the %d local members", got, n)
	}
	redRemote := netip.MustParseAddr("10.2.1.9")
	if got := copies(k.UplinkProgram(), frame{Src: h2MAC, Dst: bpftest.MustMAC("03:00:0a:02:01:00"), Saddr: redRemote, Daddr: netip.MustParseAddr("10.2.1.255"), Proto: udp}); got != 1 {
		t.Fatalf("red/web's broadcast made %d copies, want 1: the other tenant's one VM only", got)
	}
	// And the large subnet's unicast still goes: the fabric to one member.
	unicast := frame{Src: h2MAC, Dst: h1MAC, Saddr: remote, Daddr: netip.AddrFrom4([4]byte{10, 1, 1, 2 + n - 1}), Proto: udp}
	runTable(t, k, k.UplinkProgram(), []progCase{{name: "unicast to the 40th member",
		in: unicast, wantVerdict: bpftest.ActRedirect, want: delivered(unicast), wantTo: 1, wantPeer: true, wantForward: "from_fabric"}})
}
