package datapath

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
)

func TestSharesAreCutFromTheTablesForTheLocalVMs(t *testing.T) {
	one, many := SharesFor(1, 16384, 65536), SharesFor(64, 16384, 65536)
	if one.IntervalNs[0] >= many.IntervalNs[0] || one.BurstNs[0] <= many.BurstNs[0] {
		t.Fatalf("more VMs must mean a smaller flow share each: 1 VM %+v, 64 VMs %+v", one, many)
	}
	for kind := range shareKindNames {
		if many.IntervalNs[kind] == 0 || many.BurstNs[kind] < many.IntervalNs[kind] {
			t.Fatalf("kind %s has no share or a burst below one unit: %+v", shareKindNames[kind], many)
		}
	}
	// Never below 100 new flows a second, however many VMs share the host.
	if crowded := SharesFor(4096, 16384, 65536); crowded.IntervalNs[0] > 1e9/100 {
		t.Fatalf("a crowded host leaves a VM %d ns between new flows, want at most 10 ms", crowded.IntervalNs[0])
	}
}

// tightShares gives every VM a burst of n units of each kind and 1 unit a
// second after it, so a test can run a VM over its share in a few frames.
func tightShares(t *testing.T, k *Kernel, n uint64) {
	t.Helper()
	var l ShareLimits
	for kind := range l.IntervalNs {
		l.IntervalNs[kind] = 1e9
		l.BurstNs[kind] = n * 1e9
	}
	if err := k.vif.ShareConfig.Put(uint32(0), l); err != nil {
		t.Fatal(err)
	}
}

func TestPrivilegedAVMOpeningFlowsAsFastAsItCanIsRefusedAloneAndCounted(t *testing.T) {
	k := loadTestKernel(t)
	tightShares(t, k, 4)
	tcp := layers.IPProtocolTCP
	var cases []progCase
	for i := 0; i < 6; i++ {
		sport := uint16(40000 + i)
		c := progCase{name: fmt.Sprintf("web1's new flow %d to db1:5432", i),
			in:          frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: tcp, Sport: sport, Dport: 5432},
			want:        &frame{Src: h1MAC, Dst: h2MAC, Saddr: web1, Daddr: db1, Proto: tcp, Sport: sport, Dport: 5432, TTL: 63},
			wantVerdict: bpftest.ActRedirect, wantTo: uint32(h1Uplink.Ifindex), wantForward: "to_fabric,routed"}
		if i > 4 { // the bucket allows burst+1 at the first instant
			c.wantVerdict, c.wantDrop, c.wantForward, c.want, c.wantTo = bpftest.ActShot, "over_share", "", nil, 0
		}
		cases = append(cases, c)
	}
	cases = append(cases,
		progCase{name: "an admitted flow of web1 carries on over its share",
			in:          frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: tcp, Sport: 40000, Dport: 5432},
			want:        &frame{Src: h1MAC, Dst: h2MAC, Saddr: web1, Daddr: db1, Proto: tcp, Sport: 40000, Dport: 5432, TTL: 63},
			wantVerdict: bpftest.ActRedirect, wantTo: uint32(h1Uplink.Ifindex), wantForward: "to_fabric,routed"})
	runTable(t, k, k.VifProgram(), cases)
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "meanwhile db1 still opens a new flow to web3, charged to web3's share",
			in:          frame{Src: h2MAC, Dst: h1MAC, Saddr: db1, Daddr: web3, Proto: layers.IPProtocolICMPv4, TTL: 63},
			want:        &frame{Src: vmac(gw), Dst: vmac(web3), Saddr: db1, Daddr: web3, Proto: layers.IPProtocolICMPv4, TTL: 63},
			wantVerdict: bpftest.ActRedirect, wantTo: 42, wantPeer: true, wantForward: "from_fabric"},
	})
	c, err := k.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Refused[web1]["flows"]; got != 1 {
		t.Fatalf("web1's refused flows = %d, want 1 (all refusals: %v)", got, c.Refused)
	}
	if _, ok := c.Refused[web3]; ok {
		t.Fatalf("web3 was refused something: %v", c.Refused)
	}
}

func TestPrivilegedADHCPFloodIsRefusedInTheKernelPastTheVMsShare(t *testing.T) {
	k := loadTestKernel(t)
	tightShares(t, k, 2)
	r, err := k.SlowPath()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	discover := frame{Src: vmac(web1), Dst: layers.EthernetBroadcast, Saddr: netip.IPv4Unspecified(),
		Daddr: netip.MustParseAddr("255.255.255.255"), Proto: layers.IPProtocolUDP, Sport: 68, Dport: 67,
		Payload: bootp(1, netip.IPv4Unspecified())}
	var cases []progCase
	for i := 0; i < 5; i++ {
		c := progCase{name: fmt.Sprintf("discover %d", i), in: discover, wantVerdict: bpftest.ActShot, wantForward: "to_agent"}
		if i > 2 {
			c.wantDrop, c.wantForward = "over_share", ""
		}
		cases = append(cases, c)
	}
	runTable(t, k, k.VifProgram(), cases)
	for i := 0; i < 3; i++ {
		if rec := readSlowPath(t, r); rec.kind != 0 {
			t.Fatalf("record %d is kind %d, want DHCP", i, rec.kind)
		}
	}
	c, err := k.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Refused[web1]["punts"]; got != 2 {
		t.Fatalf("web1's refused punts = %d, want 2", got)
	}
}

func TestPrivilegedASharePassesWithTheVMThatLeft(t *testing.T) {
	k := loadTestKernel(t)
	tightShares(t, k, 0)
	runTable(t, k, k.VifProgram(), []progCase{{name: "web1 opens a flow",
		in:          frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: layers.IPProtocolTCP, Dport: 5432},
		want:        &frame{Src: h1MAC, Dst: h2MAC, Saddr: web1, Daddr: db1, Proto: layers.IPProtocolTCP, Dport: 5432, TTL: 63},
		wantVerdict: bpftest.ActRedirect, wantTo: uint32(h1Uplink.Ifindex), wantForward: "to_fabric,routed"}})
	var s VMShare
	if err := k.vif.VmShares.Lookup(IPKey(web1), &s); err != nil {
		t.Fatalf("web1 has no share entry after opening a flow: %v", err)
	}
	d := testDesired()
	d.Local = d.Local[1:] // web1 leaves h1
	e, _, err := Compile(d, h1Uplink, testIfindex)
	if err != nil {
		t.Fatal(err)
	}
	e.Attach = nil
	if err := k.Apply(e, ""); err != nil {
		t.Fatal(err)
	}
	if err := k.vif.VmShares.Lookup(IPKey(web1), &s); err == nil {
		t.Fatal("web1's share outlived it on h1")
	}
}
