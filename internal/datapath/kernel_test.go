package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/csum"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ipam"
	"github.com/onehop/onehop/internal/testenv"
)

// Verdicts a tc program returns (linux/pkt_cls.h).
const (
	actOK       = 0
	actShot     = 2
	actRedirect = 7
)

var (
	h1MAC    = mustMAC("aa:00:00:00:00:01")
	h2MAC    = mustMAC("aa:00:00:00:00:02")
	h3MAC    = mustMAC("aa:00:00:00:00:03")
	rogueMAC = mustMAC("aa:00:00:00:00:99") // on the fabric, but no host the store knows

	web1 = netip.MustParseAddr("10.1.1.2") // local, on the vif the tests send from (ifindex 1)
	web2 = netip.MustParseAddr("10.1.1.3") // remote, on h2
	web3 = netip.MustParseAddr("10.1.1.4") // local, ifindex 42
	db1  = netip.MustParseAddr("10.1.2.2") // remote, on h2, another subnet
	gw   = netip.MustParseAddr("10.1.1.1")

	h1Uplink = Uplink{Ifindex: 7, MAC: h1MAC}
)

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func vmac(a netip.Addr) net.HardwareAddr { return ipam.VirtualMAC(a) }

// testDesired is h1's desired state as the controller compiles it.
func testDesired() intent.Desired {
	local := func(name string, ip netip.Addr) intent.LocalEndpoint {
		return intent.LocalEndpoint{Name: "blue/web/" + name, IP: ip.String(), MAC: vmac(ip).String(), Interface: "vif-" + name}
	}
	return intent.Desired{
		Node:  "h1",
		VMNet: "10.0.0.0/8",
		Local: []intent.LocalEndpoint{local("web1", web1), local("web3", web3)},
		// web may reach db on tcp/5432; db may ping web.
		Visibility: []intent.VisRule{
			{SrcFarm: 1, SrcSubnet: 1, DstFarm: 1, DstSubnet: 2, Proto: 6, Port: 5432},
			{SrcFarm: 1, SrcSubnet: 2, DstFarm: 1, DstSubnet: 1, Proto: 1},
		},
	}
}

// The test runs inject frames as if they came in on loopback (ifindex 1), the
// only device BPF_PROG_RUN lets every namespace name; web1's vif is given
// that ifindex.
func testIfindex(name string) (int, error) {
	switch name {
	case "vif-web1":
		return 1, nil
	case "vif-web3":
		return 42, nil
	}
	return 0, os.ErrNotExist
}

type frame struct {
	src, dst   net.HardwareAddr
	ethType    layers.EthernetType
	saddr      netip.Addr
	daddr      netip.Addr
	proto      layers.IPProtocol
	ihl        uint8  // 0: 5; 6 adds one word of options
	fragOffset uint16 // in 8-byte units
	moreFrags  bool   // the MF flag: a fragment with more to come
	ipID       uint16
	cutL4      int // >0: keep only this many bytes after the IPv4 header (tot_len follows)
	arpOp      uint16
	arpSHA     net.HardwareAddr
	arpTHA     net.HardwareAddr
	vlan       bool
	truncate   int    // cut the frame to this many bytes
	ttl        uint8  // 0: 64
	sport      uint16 // 0: 40000
	dport      uint16 // 0: 5201
	icmpType   uint8  // 0: echo request (8); set 100 for an echo reply (0)
	icmpID     uint16 // 0: 1
	payload    []byte // nil: 32 bytes of 0xab
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func (f frame) bytes(t testing.TB) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: f.src, DstMAC: f.dst, EthernetType: f.ethType}
	if f.ethType == 0 {
		eth.EthernetType = layers.EthernetTypeIPv4
	}
	var ls []gopacket.SerializableLayer
	if f.vlan {
		eth.EthernetType = layers.EthernetTypeDot1Q
		ls = append(ls, eth, &layers.Dot1Q{VLANIdentifier: 10, Type: layers.EthernetTypeIPv4})
	} else {
		ls = append(ls, eth)
	}
	payload := gopacket.Payload(bytes.Repeat([]byte{0xab}, 32))
	if f.payload != nil {
		payload = f.payload
	}
	switch eth.EthernetType {
	case layers.EthernetTypeARP:
		sha := f.arpSHA
		if sha == nil {
			sha = f.src
		}
		ls = append(ls, &layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4,
			HwAddressSize: 6, ProtAddressSize: 4, Operation: f.arpOp,
			SourceHwAddress: sha, SourceProtAddress: f.saddr.AsSlice(),
			DstHwAddress: orZeroMAC(f.arpTHA), DstProtAddress: f.daddr.AsSlice()})
	case layers.EthernetTypeIPv6:
		ls = append(ls, &layers.IPv6{Version: 6, NextHeader: layers.IPProtocolUDP, HopLimit: 64,
			SrcIP: net.ParseIP("fd00::1"), DstIP: net.ParseIP("fd00::2")}, payload)
	default:
		ip := &layers.IPv4{Version: 4, TTL: orDefault(f.ttl, 64), Protocol: f.proto, SrcIP: f.saddr.AsSlice(), DstIP: f.daddr.AsSlice(),
			FragOffset: f.fragOffset, Id: f.ipID}
		if f.moreFrags {
			ip.Flags = layers.IPv4MoreFragments
		}
		if f.ihl == 6 {
			ip.Options = []layers.IPv4Option{{OptionType: 1}, {OptionType: 1}, {OptionType: 1}, {OptionType: 0}}
		}
		ls = append(ls, ip)
		switch f.proto {
		case layers.IPProtocolTCP:
			tcp := &layers.TCP{SrcPort: layers.TCPPort(orDefault(f.sport, 40000)), DstPort: layers.TCPPort(orDefault(f.dport, 5201)), SYN: true, Window: 1000}
			tcp.SetNetworkLayerForChecksum(ip)
			ls = append(ls, tcp, payload)
		case layers.IPProtocolUDP:
			udp := &layers.UDP{SrcPort: layers.UDPPort(orDefault(f.sport, 40000)), DstPort: layers.UDPPort(orDefault(f.dport, 5201))}
			udp.SetNetworkLayerForChecksum(ip)
			ls = append(ls, udp, payload)
		default:
			typ := orDefault(f.icmpType, 8)
			if typ == 100 {
				typ = 0
			}
			ls = append(ls, &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(typ, 0), Id: orDefault(f.icmpID, 1), Seq: 1}, payload)
		}
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		t.Fatalf("build frame: %v", err)
	}
	b := buf.Bytes()
	if f.ihl != 0 && f.ihl != 6 {
		b[14] = 0x40 | f.ihl
	}
	if f.cutL4 > 0 {
		hl := int(b[14]&0x0f) * 4
		b = b[:14+hl+f.cutL4]
		binary.BigEndian.PutUint16(b[16:18], uint16(hl+f.cutL4))
		csum.SetIPv4(b[14:])
	}
	if f.truncate > 0 {
		b = b[:f.truncate]
	}
	return b
}

type progCase struct {
	name        string
	in          frame
	wantVerdict uint32
	want        *frame // the whole expected output frame (every redirect row has one, or wantBytes)
	wantBytes   []byte // the whole expected output, for what frame cannot build
	wantDrop    string // drop counter that must rise by one
	wantForward string // forward counters that must rise by one, comma-separated
	// Where a redirect goes (every redirect row says): the target ifindex,
	// and whether into the peer's namespace (bpf_redirect_peer) rather than
	// out of the device (bpf_redirect).
	wantTo   uint32
	wantPeer bool
	// wantClones lists the ifindexes copies were sent to (bpf_clone_redirect),
	// in order; nil: none.
	wantClones []uint32
}

func loadTestKernel(t testing.TB) *Kernel {
	t.Helper()
	return loadTestKernelWith(t, testDesired())
}

func loadTestKernelWith(t testing.TB, d intent.Desired) *Kernel {
	t.Helper()
	return loadTestKernelWithIfindex(t, d, testIfindex)
}

func loadTestKernelWithIfindex(t testing.TB, d intent.Desired, ifindexOf func(string) (int, error)) *Kernel {
	t.Helper()
	return loadKernel(t, Options{testHooks: true}, d, ifindexOf)
}

// loadKernel loads the objects o names, with h1's maps as its agent writes
// them and what its ARP engine would have learned.
func loadKernel(t testing.TB, o Options, d intent.Desired, ifindexOf func(string) (int, error)) *Kernel {
	t.Helper()
	k := openTestKernel(t, o)
	e := compileTest(t, d, ifindexOf)
	if err := k.Apply(e, ""); err != nil {
		t.Fatalf("apply: %v", err)
	}
	// What h1's ARP engine would have learned: web2 and db1 live on h2.
	seedMapping(t, k, web2, h2MAC)
	seedMapping(t, k, db1, h2MAC)
	return k
}

// openTestKernel loads the programs unpinned: the objects built with test
// hooks (every redirect logged) when o.testHooks is set, which every table
// test does; the production ones otherwise (the cost benchmark).
func openTestKernel(t testing.TB, o Options) *Kernel {
	t.Helper()
	testenv.RequireRoot(t, "BPF_PROG_RUN (unprivileged BPF is disabled on this machine)")
	k, err := Open("", o)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("load datapath: %v\nverifier log:\n%+v", err, ve)
		}
		t.Fatalf("load datapath: %v", err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

// testNodes are the node records of the store h1's agent reads: h1 itself,
// h2 and h3. Any other MAC on the fabric is no host.
var testNodes = []intent.Node{
	{Name: "h1", UplinkMAC: h1MAC.String()},
	{Name: "h2", UplinkMAC: h2MAC.String()},
	{Name: "h3", UplinkMAC: h3MAC.String()},
}

// compileTest compiles d (and the known hosts) as h1's agent would.
func compileTest(t testing.TB, d intent.Desired, ifindexOf func(string) (int, error)) Entries {
	t.Helper()
	e, missing, err := Compile(d, h1Uplink, ifindexOf)
	if err != nil || len(missing) != 0 {
		t.Fatalf("compile: %v (missing %v)", err, missing)
	}
	if e.Hosts, err = CompileHosts(testNodes, "h1"); err != nil {
		t.Fatal(err)
	}
	e.Attach = nil // BPF_PROG_RUN needs no attachment
	return e
}

func seedMapping(t testing.TB, k *Kernel, ip netip.Addr, host net.HardwareAddr) {
	t.Helper()
	var m Mapping
	copy(m.HostMac[:], host)
	m.ConfirmedNs, m.UsedNs = uint64(monotonicNow()), uint64(monotonicNow())
	if err := k.vif.Mappings.Put(IPKey(ip), m); err != nil {
		t.Fatalf("seed mapping %s: %v", ip, err)
	}
}

func monotonicNow() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// mappingOf reads what the table says about ip ("" when nothing).
func mappingOf(k *Kernel, ip netip.Addr) string {
	if mac, ok := k.Mapping(ip); ok {
		return mac.String()
	}
	return ""
}

func runTable(t *testing.T, k *Kernel, prog *ebpf.Program, cases []progCase) {
	t.Helper()
	trace := redirectLog(t, prog)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before, err := k.Counters()
			if err != nil {
				t.Fatal(err)
			}
			if err := trace.Put(uint32(0), RedirectTrace{}); err != nil {
				t.Fatalf("reset redirect log: %v", err)
			}
			in := c.in.bytes(t)
			opts := &ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+256)}
			ret, err := prog.Run(opts)
			if err != nil {
				t.Fatalf("BPF_PROG_RUN: %v", err)
			}
			if ret != c.wantVerdict {
				t.Fatalf("verdict %d, want %d", ret, c.wantVerdict)
			}
			checkRedirects(t, trace, c)
			want := c.wantBytes
			if c.want != nil {
				want = c.want.bytes(t)
			}
			if c.wantVerdict == actRedirect && want == nil {
				t.Fatal("a redirect row must give the whole output frame (want or wantBytes)")
			}
			if want != nil {
				if !bytes.Equal(opts.DataOut, want) {
					t.Fatalf("output frame\n got %x\nwant %x", opts.DataOut, want)
				}
			}
			after, err := k.Counters()
			if err != nil {
				t.Fatal(err)
			}
			for name, n := range after.Drops {
				delta := n - before.Drops[name]
				if name == c.wantDrop && delta != 1 {
					t.Errorf("drop counter %s rose by %d, want 1", name, delta)
				}
				if name != c.wantDrop && delta != 0 {
					t.Errorf("drop counter %s rose by %d, want 0", name, delta)
				}
			}
			if c.wantDrop != "" {
				if _, ok := after.Drops[c.wantDrop]; !ok {
					t.Errorf("no drop counter named %s", c.wantDrop)
				}
			}
			wantFwd := map[string]bool{}
			for _, f := range strings.Split(c.wantForward, ",") {
				wantFwd[f] = f != ""
			}
			for name, n := range after.Forwards {
				delta := n - before.Forwards[name]
				if wantFwd[name] != (delta == 1) || delta > 1 {
					t.Errorf("forward counter %s rose by %d", name, delta)
				}
			}
			for name := range wantFwd {
				if _, ok := after.Forwards[name]; name != "" && !ok {
					t.Errorf("no forward counter named %s", name)
				}
			}
		})
	}
}

func TestPrivilegedVifProgram(t *testing.T) {
	k := loadTestKernel(t)
	tcp, udp, icmp := layers.IPProtocolTCP, layers.IPProtocolUDP, layers.IPProtocolICMPv4
	arpReq := func(target netip.Addr) frame {
		return frame{src: vmac(web1), dst: layers.EthernetBroadcast, ethType: layers.EthernetTypeARP, saddr: web1, daddr: target, arpOp: 1}
	}
	arpReply := func(target netip.Addr, targetMAC net.HardwareAddr) *frame {
		// Built as the reply from target to web1 (the frame builder puts
		// zeros in tha, so the expected bytes are patched in the run below).
		return &frame{src: targetMAC, dst: vmac(web1), ethType: layers.EthernetTypeARP, saddr: target, daddr: web1, arpOp: 2}
	}
	expired := frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db1, proto: tcp, dport: 5432, ttl: 1}
	cases := []progCase{
		{name: "tcp to a VM on the same host goes to its vif with MACs of the VMs",
			in:          frame{src: vmac(web1), dst: vmac(web3), saddr: web1, daddr: web3, proto: tcp},
			wantVerdict: actRedirect, want: &frame{src: vmac(web1), dst: vmac(web3), saddr: web1, daddr: web3, proto: tcp},
			wantTo: 42, wantPeer: true, wantForward: "local"},
		{name: "udp to a VM on another host leaves host-MAC to host-MAC",
			in:          frame{src: vmac(web1), dst: vmac(web2), saddr: web1, daddr: web2, proto: udp},
			wantVerdict: actRedirect, want: &frame{src: h1MAC, dst: h2MAC, saddr: web1, daddr: web2, proto: udp},
			wantTo: 7, wantForward: "to_fabric"},
		{name: "ip options are carried",
			in:          frame{src: vmac(web1), dst: vmac(web3), saddr: web1, daddr: web3, proto: icmp, ihl: 6},
			wantVerdict: actRedirect, want: &frame{src: vmac(web1), dst: vmac(web3), saddr: web1, daddr: web3, proto: icmp, ihl: 6},
			wantTo: 42, wantPeer: true, wantForward: "local"},
		{name: "fragments are carried",
			in:          frame{src: vmac(web1), dst: vmac(web2), saddr: web1, daddr: web2, proto: udp, fragOffset: 100},
			wantVerdict: actRedirect, want: &frame{src: h1MAC, dst: h2MAC, saddr: web1, daddr: web2, proto: udp, fragOffset: 100},
			wantTo: 7, wantForward: "to_fabric"},
		{name: "spoofed source ip is dropped",
			in:          frame{src: vmac(web1), dst: vmac(web2), saddr: web3, daddr: web2, proto: udp},
			wantVerdict: actShot, wantDrop: "spoofed_ip"},
		{name: "spoofed source mac is dropped",
			in:          frame{src: vmac(web3), dst: vmac(web2), saddr: web1, daddr: web2, proto: tcp},
			wantVerdict: actShot, wantDrop: "spoofed_mac"},
		{name: "tcp to an allowed port of another subnet crosses the gateway: TTL down, host MACs",
			in:          frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db1, proto: tcp, dport: 5432},
			wantVerdict: actRedirect, want: &frame{src: h1MAC, dst: h2MAC, saddr: web1, daddr: db1, proto: tcp, dport: 5432, ttl: 63},
			wantTo: 7, wantForward: "to_fabric,routed"},
		{name: "ttl 1 at the gateway hop comes back as the gateway's time-exceeded",
			in:          expired,
			wantVerdict: actRedirect, wantBytes: timeExceeded(t, expired), wantTo: 1, wantForward: "gateway_reply"},
		{name: "ping to the subnet's gateway is answered in the datapath",
			in:          frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: gw, proto: icmp},
			wantVerdict: actRedirect, want: &frame{src: vmac(gw), dst: vmac(web1), saddr: gw, daddr: web1, proto: icmp, icmpType: 100},
			wantTo: 1, wantForward: "gateway_reply"},
		{name: "another subnet without a rule is dropped before the wire",
			in:          frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db1, proto: tcp},
			wantVerdict: actShot, wantDrop: "not_visible"},
		{name: "destination outside the tenant space is dropped",
			in:          frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: netip.MustParseAddr("192.0.2.1"), proto: icmp},
			wantVerdict: actShot, wantDrop: "no_route"},
		{name: "arp for a VM of the subnet is answered locally",
			in: arpReq(web2), wantVerdict: actRedirect, want: arpReply(web2, vmac(web2)), wantTo: 1, wantForward: "arp_reply"},
		{name: "arp for the gateway is answered with its derived MAC",
			in: arpReq(gw), wantVerdict: actRedirect, want: arpReply(gw, vmac(gw)), wantTo: 1, wantForward: "arp_reply"},
		{name: "arp the mapping table cannot answer goes to the subnet's multicast address from the host",
			in:          arpReq(netip.MustParseAddr("10.1.1.77")),
			wantVerdict: actRedirect,
			want: &frame{src: h1MAC, dst: mustMAC("03:00:0a:01:01:00"), ethType: layers.EthernetTypeARP, saddr: web1,
				daddr: netip.MustParseAddr("10.1.1.77"), arpOp: 1, arpSHA: vmac(web1)},
			wantTo: 7, wantForward: "arp_to_fabric"},
		{name: "asked again within a second, it is not repeated on the fabric",
			in: arpReq(netip.MustParseAddr("10.1.1.77")), wantVerdict: actShot, wantDrop: "arp_unknown_target"},
		{name: "arp for another subnet is dropped",
			in: arpReq(db1), wantVerdict: actShot, wantDrop: "arp_other_subnet"},
		{name: "arp reply from a VM never leaves",
			in:          frame{src: vmac(web1), dst: vmac(web3), ethType: layers.EthernetTypeARP, saddr: web1, daddr: web3, arpOp: 2},
			wantVerdict: actShot, wantDrop: "arp_not_request"},
		{name: "arp claiming another VM's address is dropped",
			in:          frame{src: vmac(web1), dst: layers.EthernetBroadcast, ethType: layers.EthernetTypeARP, saddr: web3, daddr: web2, arpOp: 1},
			wantVerdict: actShot, wantDrop: "arp_spoofed"},
		{name: "arp with a forged sender hardware address is dropped",
			in:          frame{src: vmac(web1), dst: layers.EthernetBroadcast, ethType: layers.EthernetTypeARP, saddr: web1, daddr: web2, arpOp: 1, arpSHA: vmac(web3)},
			wantVerdict: actShot, wantDrop: "arp_spoofed"},
		{name: "ipv6 is dropped as unsupported",
			in: frame{src: vmac(web1), dst: vmac(web3), ethType: layers.EthernetTypeIPv6}, wantVerdict: actShot, wantDrop: "unsupported"},
		{name: "a vlan tag in the frame is dropped and counted as such",
			in: frame{src: vmac(web1), dst: vmac(web3), saddr: web1, daddr: web3, proto: udp, vlan: true}, wantVerdict: actShot, wantDrop: "vlan_tagged"},
		// BPF_PROG_RUN itself refuses IPv4 frames shorter than 20 bytes of
		// header, so the truncation tested is a header longer than the frame.
		{name: "ipv4 header longer than the frame is dropped as malformed",
			in: frame{src: vmac(web1), dst: vmac(web3), saddr: web1, daddr: web3, proto: udp, ihl: 15, truncate: 34}, wantVerdict: actShot, wantDrop: "malformed"},
		{name: "ipv4 total length beyond the frame is dropped as malformed, not delivered",
			in: frame{src: vmac(web1), dst: vmac(web3), saddr: web1, daddr: web3, proto: udp, truncate: 14 + 20 + 8 + 10}, wantVerdict: actShot, wantDrop: "malformed"},
		{name: "ipv4 header length below 20 is dropped as malformed",
			in: frame{src: vmac(web1), dst: vmac(web3), saddr: web1, daddr: web3, proto: udp, ihl: 4}, wantVerdict: actShot, wantDrop: "malformed"},
		{name: "truncated arp is dropped as malformed",
			in: frame{src: vmac(web1), dst: layers.EthernetBroadcast, ethType: layers.EthernetTypeARP, saddr: web1, daddr: web2, arpOp: 1, truncate: 30}, wantVerdict: actShot, wantDrop: "malformed"},
	}
	// The ARP reply's target hardware address is the asker's MAC.
	for i := range cases {
		if cases[i].want != nil && cases[i].want.ethType == layers.EthernetTypeARP && cases[i].want.arpOp == 2 {
			cases[i].want = withARPTargetMAC(cases[i].want, vmac(web1))
		}
	}
	runTable(t, k, k.VifProgram(), cases)
}

// withARPTargetMAC marks an expected ARP frame so its tha is mac.
func withARPTargetMAC(f *frame, mac net.HardwareAddr) *frame {
	g := *f
	g.arpTHA = mac
	return &g
}

func TestPrivilegedUplinkProgram(t *testing.T) {
	k := loadTestKernel(t)
	tcp, icmp := layers.IPProtocolTCP, layers.IPProtocolICMPv4
	mgmt := netip.MustParseAddr("192.168.100.10")
	cases := []progCase{
		{name: "from the holding host into the local VM with virtual MACs restored",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: web2, daddr: web1, proto: tcp},
			wantVerdict: actRedirect, want: &frame{src: vmac(web2), dst: vmac(web1), saddr: web2, daddr: web1, proto: tcp},
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
		{name: "from another subnet without a rule is dropped on the receiving host too",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: db1, daddr: web1, proto: tcp, dport: 22},
			wantVerdict: actShot, wantDrop: "not_visible"},
		{name: "from another subnet with a rule arrives from the gateway's MAC",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: db1, daddr: web1, proto: icmp, ttl: 63},
			wantVerdict: actRedirect, want: &frame{src: vmac(gw), dst: vmac(web1), saddr: db1, daddr: web1, proto: icmp, ttl: 63},
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
		{name: "a reply of a flow never started is not let in",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: db1, daddr: web1, proto: tcp, sport: 5432, dport: 40000},
			wantVerdict: actShot, wantDrop: "not_visible"},
		{name: "source VM claimed by a host that does not hold it is dropped",
			in:          frame{src: h3MAC, dst: h1MAC, saddr: web2, daddr: web1, proto: tcp},
			wantVerdict: actShot, wantDrop: "fabric_unknown_src"},
		{name: "a host claiming one of this host's VMs as source is dropped",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: web3, daddr: web1, proto: tcp},
			wantVerdict: actShot, wantDrop: "fabric_unknown_src"},
		{name: "source in a farm without a rule towards this VM is dropped",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: netip.MustParseAddr("10.9.9.9"), daddr: web1, proto: tcp},
			wantVerdict: actShot, wantDrop: "not_visible"},
		{name: "destination VM not on this host is dropped",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: web2, daddr: db1, proto: tcp},
			wantVerdict: actShot, wantDrop: "fabric_not_local"},
		{name: "management traffic goes to the host stack untouched",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: netip.MustParseAddr("192.168.100.11"), daddr: mgmt, proto: tcp},
			wantVerdict: actOK, want: &frame{src: h2MAC, dst: h1MAC, saddr: netip.MustParseAddr("192.168.100.11"), daddr: mgmt, proto: tcp},
			wantForward: "host_stack"},
		{name: "arp between hosts goes to the host stack",
			in:          frame{src: h2MAC, dst: layers.EthernetBroadcast, ethType: layers.EthernetTypeARP, saddr: netip.MustParseAddr("192.168.100.11"), daddr: mgmt, arpOp: 1},
			wantVerdict: actOK, wantForward: "host_stack"},
		{name: "tenant frame flooded towards another host is left to the stack",
			in:          frame{src: h2MAC, dst: mustMAC("aa:00:00:00:00:03"), saddr: web2, daddr: web1, proto: tcp},
			wantVerdict: actOK},
	}
	runTable(t, k, k.UplinkProgram(), cases)
	if got := mappingOf(k, netip.MustParseAddr("10.9.9.9")); got != "" {
		t.Errorf("a refused source was learned: 10.9.9.9 -> %s", got)
	}
}

func TestPrivilegedMappingTableLearnsFromTheFabric(t *testing.T) {
	k := loadTestKernel(t)
	tcp := layers.IPProtocolTCP
	web5 := netip.MustParseAddr("10.1.1.6")
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "a packet from a VM not in the table is admitted and its host learned",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: web5, daddr: web1, proto: tcp},
			wantVerdict: actRedirect, want: &frame{src: vmac(web5), dst: vmac(web1), saddr: web5, daddr: web1, proto: tcp},
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
	})
	if got := mappingOf(k, web5); got != h2MAC.String() {
		t.Fatalf("10.1.1.6 mapped to %q, want h2 (%s)", got, h2MAC)
	}
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "so the reply goes straight to h2 without a question",
			in:          frame{src: vmac(web1), dst: vmac(web5), saddr: web1, daddr: web5, proto: tcp},
			wantVerdict: actRedirect, want: &frame{src: h1MAC, dst: h2MAC, saddr: web1, daddr: web5, proto: tcp},
			wantTo: 7, wantForward: "to_fabric"},
	})
}

// arpFrame builds an ARP frame as it appears on the fabric.
func arpFrame(src, dst net.HardwareAddr, op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) frame {
	return frame{src: src, dst: dst, ethType: layers.EthernetTypeARP, arpOp: op, arpSHA: sha, saddr: spa, arpTHA: tha, daddr: tpa}
}

// seedAsking puts an entry "being asked for" (no host yet) into the table,
// as a VM's or the agent's question leaves it.
func seedAsking(t testing.TB, k *Kernel, ip netip.Addr) {
	t.Helper()
	m := Mapping{ConfirmedNs: uint64(monotonicNow()), UsedNs: uint64(monotonicNow())}
	if err := k.vif.Mappings.Put(IPKey(ip), m); err != nil {
		t.Fatalf("seed question for %s: %v", ip, err)
	}
}

func TestPrivilegedARPEngineOnTheFabric(t *testing.T) {
	k := loadTestKernel(t)
	hostIP := netip.MustParseAddr("192.168.100.10")
	asker := netip.MustParseAddr("10.1.1.50") // a VM on h2 asking for web1
	far := netip.MustParseAddr("10.1.1.60")   // a VM on h2 that web1 asked for
	db9 := netip.MustParseAddr("10.1.2.9")    // a VM on h2 the agent asked for
	arp := arpFrame
	subnetMAC := mustMAC("03:00:0a:01:01:00")
	seedAsking(t, k, far)
	seedAsking(t, k, db9)
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "a question for a VM of this host is answered from this host's uplink",
			in:          arp(h2MAC, subnetMAC, 1, vmac(asker), asker, nil, web1),
			wantVerdict: actRedirect, want: ptr(arp(h1MAC, h2MAC, 2, vmac(web1), web1, vmac(asker), asker)),
			wantTo: 7, wantForward: "arp_answered"},
		{name: "a question for a VM not here is dropped quietly",
			in:          arp(h2MAC, subnetMAC, 1, vmac(asker), asker, nil, netip.MustParseAddr("10.1.1.61")),
			wantVerdict: actShot, wantDrop: "arp_not_here"},
		{name: "the answer to a VM's question is learned and handed to that VM",
			in:          arp(h2MAC, h1MAC, 2, vmac(far), far, vmac(web1), web1),
			wantVerdict: actRedirect, want: ptr(arp(vmac(far), vmac(web1), 2, vmac(far), far, vmac(web1), web1)),
			wantTo: 1, wantPeer: true, wantForward: "arp_learned,arp_reply"},
		{name: "the answer to the agent's own question goes to the agent",
			in:          arp(h2MAC, h1MAC, 2, vmac(db9), db9, h1MAC, hostIP),
			wantVerdict: actShot, wantForward: "arp_learned,to_agent"},
		{name: "an announcement from the host an entry names confirms it",
			in:          arp(h2MAC, layers.EthernetBroadcast, 2, vmac(web2), web2, layers.EthernetBroadcast, web2),
			wantVerdict: actShot, wantForward: "arp_learned"},
		{name: "an announcement of a VM nobody here talks to adds nothing",
			in:          arp(h3MAC, layers.EthernetBroadcast, 2, vmac(far), netip.MustParseAddr("10.1.1.62"), layers.EthernetBroadcast, netip.MustParseAddr("10.1.1.62")),
			wantVerdict: actShot, wantDrop: "arp_not_here"},
		{name: "a host claiming one of this host's VMs by ARP is refused",
			in:          arp(h3MAC, h1MAC, 2, vmac(web3), web3, vmac(web1), web1),
			wantVerdict: actShot, wantDrop: "fabric_arp_conflict"},
		{name: "a VM-space reply addressed to another host is left alone",
			in:          arp(h2MAC, h3MAC, 2, vmac(far), far, vmac(web1), web1),
			wantVerdict: actOK},
	})
	for ip, want := range map[netip.Addr]string{asker: h2MAC.String(), far: h2MAC.String(), db9: h2MAC.String(),
		web2: h2MAC.String(), netip.MustParseAddr("10.1.1.62"): "", web3: "", netip.MustParseAddr("10.1.1.61"): ""} {
		if got := mappingOf(k, ip); got != want {
			t.Errorf("mapping of %s = %q, want %q", ip, got, want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestPrivilegedUnmappedDestinationIsHeldForTheAgent(t *testing.T) {
	k := loadTestKernel(t)
	r, err := k.SlowPath()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	db9 := netip.MustParseAddr("10.1.2.9")
	in := frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db9, proto: layers.IPProtocolTCP, dport: 5432}
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "an admitted packet for an unmapped VM goes to the agent, gateway hop taken",
			in: in, wantVerdict: actShot, wantForward: "routed,held"},
		{name: "an unmapped VM the rules hide is refused before anyone is asked",
			in:          frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db9, proto: layers.IPProtocolTCP, dport: 22},
			wantVerdict: actShot, wantDrop: "not_visible"},
	})
	// The agent holds a bounded number per address and second; beyond, the
	// kernel drops them itself. The first one above was the first held.
	for i := 2; i <= 16; i++ {
		runTable(t, k, k.VifProgram(), []progCase{{name: fmt.Sprintf("held %d of 16", i), in: in, wantVerdict: actShot, wantForward: "routed,held"}})
	}
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "the 17th within a second is dropped in the kernel", in: in, wantVerdict: actShot, wantForward: "routed", wantDrop: "unresolved"},
		{name: "udp to the gateway is no VM's",
			in:          frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: gw, proto: layers.IPProtocolUDP},
			wantVerdict: actShot, wantDrop: "no_route"},
		{name: "nor is a subnet's network address",
			in:          frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: netip.MustParseAddr("10.1.2.0"), proto: layers.IPProtocolUDP},
			wantVerdict: actShot, wantDrop: "no_route"},
	})
	rec := readSlowPath(t, r)
	// Complete but for the destination host: the engine fills in its MAC.
	want := frame{src: h1MAC, dst: vmac(gw), saddr: web1, daddr: db9, proto: layers.IPProtocolTCP, dport: 5432, ttl: 63}.bytes(t)
	if rec.kind != 1 || len(rec.data) != rec.origLen || !bytes.Equal(rec.data, want) {
		t.Fatalf("record kind %d len %d/%d\n got %x\nwant %x", rec.kind, len(rec.data), rec.origLen, rec.data, want)
	}
}

type slowRecord struct {
	kind, ifindex, origLen int
	data                   []byte
}

// readSlowPath reads the next struct slowpath_event the datapath handed over.
func readSlowPath(t *testing.T, r *ringbuf.Reader) slowRecord {
	t.Helper()
	r.SetDeadline(time.Now().Add(time.Second))
	rec, err := r.Read()
	if err != nil {
		t.Fatalf("no slow-path record: %v", err)
	}
	var ev SlowpathEvent
	if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &ev); err != nil {
		t.Fatalf("slow-path record of %d bytes: %v", len(rec.RawSample), err)
	}
	if int(ev.Len) > len(ev.Data) {
		t.Fatalf("slow-path record claims %d bytes", ev.Len)
	}
	return slowRecord{kind: int(ev.Kind), ifindex: int(ev.Ifindex), origLen: int(ev.OrigLen), data: ev.Data[:ev.Len]}
}

func TestPrivilegedProxyARPAnswersForOtherSubnetsWithTheGateway(t *testing.T) {
	d := testDesired()
	d.ProxyARPFarms = []uint8{1}
	k := loadTestKernelWith(t, d)
	req := frame{src: vmac(web1), dst: layers.EthernetBroadcast, ethType: layers.EthernetTypeARP, saddr: web1, daddr: db1, arpOp: 1}
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "arp for another subnet gets the asker's gateway MAC",
			in:          req,
			wantVerdict: actRedirect,
			want: &frame{src: vmac(gw), dst: vmac(web1), ethType: layers.EthernetTypeARP, saddr: db1, daddr: web1, arpOp: 2,
				arpSHA: vmac(gw), arpTHA: vmac(web1)},
			wantTo: 1, wantForward: "arp_reply"},
		{name: "but not for an address outside the tenant space",
			in:          frame{src: vmac(web1), dst: layers.EthernetBroadcast, ethType: layers.EthernetTypeARP, saddr: web1, daddr: netip.MustParseAddr("192.0.2.1"), arpOp: 1},
			wantVerdict: actShot, wantDrop: "arp_other_subnet"},
	})
}

func orZeroMAC(m net.HardwareAddr) net.HardwareAddr {
	if m == nil {
		return make(net.HardwareAddr, 6)
	}
	return m
}

func TestPrivilegedRepliesOfAnAllowedFlowPassBothWays(t *testing.T) {
	k := loadTestKernel(t)
	tcp := layers.IPProtocolTCP
	// web1 opens tcp/5432 to db1: allowed, and remembered.
	runTable(t, k, k.VifProgram(), []progCase{{name: "web1 connects to db1:5432",
		in:          frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db1, proto: tcp, dport: 5432},
		wantVerdict: actRedirect, want: &frame{src: h1MAC, dst: h2MAC, saddr: web1, daddr: db1, proto: tcp, dport: 5432, ttl: 63},
		wantTo: 7, wantForward: "to_fabric,routed"}})
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "db1's reply comes in",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: db1, daddr: web1, proto: tcp, sport: 5432, dport: 40000},
			wantVerdict: actRedirect, want: &frame{src: vmac(gw), dst: vmac(web1), saddr: db1, daddr: web1, proto: tcp, sport: 5432, dport: 40000},
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
		{name: "but not to another port of web1",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: db1, daddr: web1, proto: tcp, sport: 5432, dport: 40001},
			wantVerdict: actShot, wantDrop: "not_visible"},
	})
}

func TestPrivilegedICMPPassesOnlyAsAnAnswer(t *testing.T) {
	k := loadTestKernel(t)
	icmp := layers.IPProtocolICMPv4
	// The rules: db may ping web; web may reach db on tcp/5432 only.
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "db1 pings web1 (allowed)",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: db1, daddr: web1, proto: icmp, icmpID: 7, ttl: 63},
			wantVerdict: actRedirect, want: &frame{src: vmac(gw), dst: vmac(web1), saddr: db1, daddr: web1, proto: icmp, icmpID: 7, ttl: 63},
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
	})
	// What web1 sends back about db1's ping: the quoted header went db1 -> web1.
	quote := func(id uint16) []byte {
		inner := frame{src: h2MAC, dst: h1MAC, saddr: db1, daddr: web1, proto: icmp, icmpID: id}.bytes(t)
		return inner[14 : 14+28]
	}
	// quoteWith: the same, with ihl words of header (0: 5) and the quoted
	// packet a fragment at fragOffset (its first 8 bytes still read as
	// an echo with id: payload that looks like the flow).
	quoteWith := func(id uint16, ihl uint8, fragOffset uint16) []byte {
		inner := frame{src: h2MAC, dst: h1MAC, saddr: db1, daddr: web1, proto: icmp, icmpID: id, ihl: ihl, fragOffset: fragOffset}.bytes(t)
		hl := int(inner[14]&0x0f) * 4
		return inner[14 : 14+hl+8]
	}
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "web1's echo reply answers it",
			in:          frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db1, proto: icmp, icmpType: 100, icmpID: 7},
			wantVerdict: actRedirect, want: &frame{src: h1MAC, dst: h2MAC, saddr: web1, daddr: db1, proto: icmp, icmpType: 100, icmpID: 7, ttl: 63},
			wantTo: 7, wantForward: "to_fabric,routed"},
		{name: "but web1's echo request with the same id opens nothing web may not",
			in:          frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db1, proto: icmp, icmpID: 7},
			wantVerdict: actShot, wantDrop: "not_visible"},
		{name: "an ICMP error about db1's flow is related and passes",
			in:          frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db1, proto: icmp, icmpType: 3, payload: quote(7)},
			wantVerdict: actRedirect, want: &frame{src: h1MAC, dst: h2MAC, saddr: web1, daddr: db1, proto: icmp, icmpType: 3, payload: quote(7), ttl: 63},
			wantTo: 7, wantForward: "to_fabric,routed"},
		{name: "an ICMP error about a flow that never was does not",
			in:          frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db1, proto: icmp, icmpType: 3, payload: quote(8)},
			wantVerdict: actShot, wantDrop: "not_visible"},
		// The quote is read one way for the router and port space
		// (bpf/lib/icmp_error.h): IP options in the quoted header are
		// allowed, and a quoted later fragment has no ports to read.
		{name: "an ICMP error quoting db1's ping with IP options is related and passes",
			in:          frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db1, proto: icmp, icmpType: 3, payload: quoteWith(7, 6, 0)},
			wantVerdict: actRedirect, want: &frame{src: h1MAC, dst: h2MAC, saddr: web1, daddr: db1, proto: icmp, icmpType: 3, payload: quoteWith(7, 6, 0), ttl: 63},
			wantTo: 7, wantForward: "to_fabric,routed"},
		{name: "an ICMP error quoting a later fragment is no answer, whatever its payload looks like",
			in:          frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db1, proto: icmp, icmpType: 3, payload: quoteWith(7, 0, 5)},
			wantVerdict: actShot, wantDrop: "not_visible"},
		{name: "web1 opens tcp/5432 to db1 (allowed)",
			in:          frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db1, proto: layers.IPProtocolTCP, dport: 5432},
			wantVerdict: actRedirect, want: &frame{src: h1MAC, dst: h2MAC, saddr: web1, daddr: db1, proto: layers.IPProtocolTCP, dport: 5432, ttl: 63},
			wantTo: 7, wantForward: "to_fabric,routed"},
	})
	flow := frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db1, proto: layers.IPProtocolTCP, dport: 5432}.bytes(t)[14 : 14+28]
	stranger := netip.MustParseAddr("10.9.9.9")
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "a third party quoting web1's flow in an ICMP error gets nothing through",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: stranger, daddr: web1, proto: icmp, icmpType: 3, payload: flow},
			wantVerdict: actShot, wantDrop: "not_visible"},
	})
}

func TestPrivilegedDHCPRequestIsHandedToTheAgentWhole(t *testing.T) {
	k := loadTestKernel(t)
	r, err := k.SlowPath()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	udp := layers.IPProtocolUDP
	zero := netip.IPv4Unspecified()
	bcast := netip.MustParseAddr("255.255.255.255")
	discover := frame{src: vmac(web1), dst: layers.EthernetBroadcast, saddr: zero, daddr: bcast, proto: udp, sport: 68, dport: 67,
		payload: bootp(1, netip.IPv4Unspecified())}
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "dhcp from the VM's own MAC goes to the agent, not the wire", in: discover, wantVerdict: actShot, wantForward: "to_agent"},
		{name: "dhcp from another MAC is dropped as spoofed",
			in: frame{src: vmac(web3), dst: layers.EthernetBroadcast, saddr: zero, daddr: bcast, proto: udp, sport: 68, dport: 67,
				payload: bootp(1, netip.IPv4Unspecified())},
			wantVerdict: actShot, wantDrop: "spoofed_mac"},
		{name: "a rogue dhcp server in a VM reaches nobody",
			in:          frame{src: vmac(web1), dst: layers.EthernetBroadcast, saddr: web1, daddr: bcast, proto: udp, sport: 67, dport: 68},
			wantVerdict: actShot, wantDrop: "rogue_dhcp"},
	})
	rec := readSlowPath(t, r)
	want := discover.bytes(t)
	if rec.kind != 0 || rec.ifindex != 1 || !bytes.Equal(rec.data, want) {
		t.Fatalf("record kind %d ifindex %d len %d, want 0 (DHCP), 1 and the %d-byte frame", rec.kind, rec.ifindex, len(rec.data), len(want))
	}
}

// bootp is a BOOTP/DHCP message body (RFC 2131): op 1 request, 2 reply;
// giaddr set when a relay agent forwarded it.
func bootp(op byte, giaddr netip.Addr) []byte {
	b := make([]byte, 240)
	b[0], b[1], b[2] = op, 1, 6 // op, htype Ethernet, hlen
	g := giaddr.As4()
	copy(b[24:28], g[:])
	copy(b[236:240], []byte{99, 130, 83, 99}) // the DHCP magic cookie
	return b
}

// A VM is only ever a DHCP client. What a server or relay says, from any
// port to any DHCP port, goes nowhere, even inside its subnet where
// nothing else is checked.
func TestPrivilegedAVMNeverSendsDHCPServerOrRelayMessages(t *testing.T) {
	k := loadTestKernel(t)
	udp := layers.IPProtocolUDP
	bcast := netip.MustParseAddr("255.255.255.255")
	zero := netip.IPv4Unspecified()
	reply := bootp(2, zero)
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "a reply from port 68 to port 68 of a VM of its subnet",
			in:          frame{src: vmac(web1), dst: vmac(web3), saddr: web1, daddr: web3, proto: udp, sport: 68, dport: 68, payload: reply},
			wantVerdict: actShot, wantDrop: "rogue_dhcp"},
		{name: "a reply from port 68 to port 68, broadcast",
			in:          frame{src: vmac(web1), dst: layers.EthernetBroadcast, saddr: web1, daddr: bcast, proto: udp, sport: 68, dport: 68, payload: reply},
			wantVerdict: actShot, wantDrop: "rogue_dhcp"},
		{name: "a reply from an ephemeral port to port 68",
			in:          frame{src: vmac(web1), dst: vmac(web3), saddr: web1, daddr: web3, proto: udp, sport: 40000, dport: 68, payload: reply},
			wantVerdict: actShot, wantDrop: "rogue_dhcp"},
		{name: "a BOOTREPLY sent as if by a client (68 to 67)",
			in:          frame{src: vmac(web1), dst: layers.EthernetBroadcast, saddr: web1, daddr: bcast, proto: udp, sport: 68, dport: 67, payload: reply},
			wantVerdict: actShot, wantDrop: "rogue_dhcp"},
		{name: "a relayed request (giaddr set)",
			in: frame{src: vmac(web1), dst: layers.EthernetBroadcast, saddr: web1, daddr: bcast, proto: udp, sport: 68, dport: 67,
				payload: bootp(1, web1)},
			wantVerdict: actShot, wantDrop: "rogue_dhcp"},
		{name: "a relay's forward (67 to 67)",
			in:          frame{src: vmac(web1), dst: vmac(web3), saddr: web1, daddr: web3, proto: udp, sport: 67, dport: 67, payload: bootp(1, web1)},
			wantVerdict: actShot, wantDrop: "rogue_dhcp"},
		{name: "a request cut before giaddr",
			in:          frame{src: vmac(web1), dst: layers.EthernetBroadcast, saddr: web1, daddr: bcast, proto: udp, sport: 68, dport: 67, payload: []byte{1, 1, 6, 0}},
			wantVerdict: actShot, wantDrop: "rogue_dhcp"},
		{name: "but udp from port 68 to another port is no DHCP and passes",
			in:          frame{src: vmac(web1), dst: vmac(web3), saddr: web1, daddr: web3, proto: udp, sport: 68, dport: 5000},
			wantVerdict: actRedirect, want: &frame{src: vmac(web1), dst: vmac(web3), saddr: web1, daddr: web3, proto: udp, sport: 68, dport: 5000},
			wantTo: 42, wantPeer: true, wantForward: "local"},
	})
}

func TestPrivilegedVMFirewallIsOrderedDefaultDenyAndStateful(t *testing.T) {
	web4 := netip.MustParseAddr("10.1.1.5") // another VM of the subnet, on h2
	d := testDesired()
	// web3 takes ssh from its subnet except from web2, nothing else in, and
	// may not send udp out.
	d.Local[1].Firewall = &intent.Firewall{DefaultIn: "deny", DefaultOut: "allow", Rules: []intent.FirewallRule{
		{Dir: "in", Proto: "tcp", PortLo: 22, PortHi: 22, CIDR: "10.1.1.3/32", Action: "deny"},
		{Dir: "in", Proto: "tcp", PortLo: 22, PortHi: 22, CIDR: "10.1.1.0/24", Action: "allow"},
		{Dir: "out", Proto: "udp", Action: "deny"},
	}}
	// This time the frames BPF_PROG_RUN injects on ifindex 1 come from web3.
	k := loadTestKernelWithIfindex(t, d, func(name string) (int, error) {
		switch name {
		case "vif-web3":
			return 1, nil
		case "vif-web1":
			return 42, nil
		}
		return 0, os.ErrNotExist
	})
	seedMapping(t, k, web4, h2MAC)
	tcp, udp := layers.IPProtocolTCP, layers.IPProtocolUDP
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "ssh from web4 is allowed in",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: web4, daddr: web3, proto: tcp, dport: 22},
			wantVerdict: actRedirect, want: &frame{src: vmac(web4), dst: vmac(web3), saddr: web4, daddr: web3, proto: tcp, dport: 22},
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
		{name: "ssh from web2 matches the earlier deny first",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: web2, daddr: web3, proto: tcp, dport: 22},
			wantVerdict: actShot, wantDrop: "firewall_in"},
		{name: "http from web4 hits the default deny",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: web4, daddr: web3, proto: tcp, dport: 80},
			wantVerdict: actShot, wantDrop: "firewall_in"},
	})
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "web3 opens tcp to web2 (outbound allowed)",
			in:          frame{src: vmac(web3), dst: vmac(web2), saddr: web3, daddr: web2, proto: tcp, sport: 41000, dport: 8080},
			wantVerdict: actRedirect, want: &frame{src: h1MAC, dst: h2MAC, saddr: web3, daddr: web2, proto: tcp, sport: 41000, dport: 8080},
			wantTo: 7, wantForward: "to_fabric"},
		{name: "web3 may not send udp out",
			in:          frame{src: vmac(web3), dst: vmac(web2), saddr: web3, daddr: web2, proto: udp},
			wantVerdict: actShot, wantDrop: "firewall_out"},
	})
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "web2's reply passes the default deny: the firewall is stateful",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: web2, daddr: web3, proto: tcp, sport: 8080, dport: 41000},
			wantVerdict: actRedirect, want: &frame{src: vmac(web2), dst: vmac(web3), saddr: web2, daddr: web3, proto: tcp, sport: 8080, dport: 41000},
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
		{name: "but web2 cannot open its own connection to that port",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: web2, daddr: web3, proto: tcp, sport: 8081, dport: 41000},
			wantVerdict: actShot, wantDrop: "firewall_in"},
	})
}

// timeExceeded is what a router sends back about the expired frame in: from
// the gateway to the sender, quoting its IPv4 header and first 8 payload
// bytes.
func timeExceeded(t testing.TB, in frame) []byte {
	t.Helper()
	b := in.bytes(t)
	ip := &layers.IPv4{Version: 4, TOS: 0xc0, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: gw.AsSlice(), DstIP: in.saddr.AsSlice()}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		&layers.Ethernet{SrcMAC: vmac(gw), DstMAC: in.src, EthernetType: layers.EthernetTypeIPv4}, ip,
		&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(11, 0)}, gopacket.Payload(b[14:14+20+8])); err != nil {
		t.Fatalf("build time exceeded: %v", err)
	}
	return buf.Bytes()
}

func TestPrivilegedBroadcastReachesItsScopeOnly(t *testing.T) {
	k := loadTestKernel(t)
	udp := layers.IPProtocolUDP
	subnetBcast := netip.MustParseAddr("10.1.1.255")
	group := netip.MustParseAddr("239.1.2.3")
	// Frames from the fabric (the program's clones go nowhere in a test run,
	// but each copy is counted).
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "web2's subnet broadcast is copied to web1 and web3",
			in:          frame{src: h2MAC, dst: mustMAC("03:00:0a:01:01:00"), saddr: web2, daddr: subnetBcast, proto: udp},
			wantVerdict: actShot, wantClones: []uint32{1, 42}, wantForward: "broadcast"},
		{name: "a broadcast sent to another subnet's scope is refused",
			in:          frame{src: h2MAC, dst: mustMAC("03:00:0a:01:02:00"), saddr: web2, daddr: subnetBcast, proto: udp},
			wantVerdict: actShot, wantDrop: "fabric_not_broadcast"},
		{name: "a farm broadcast for a farm this host has no VM of is dropped quietly",
			in:          frame{src: h2MAC, dst: mustMAC("03:00:0a:07:00:00"), saddr: netip.MustParseAddr("10.7.1.2"), daddr: group, proto: udp, ttl: 8},
			wantVerdict: actShot, wantDrop: "no_members"},
	})
	before, _ := k.Counters()
	in := frame{src: h2MAC, dst: mustMAC("03:00:0a:01:01:00"), saddr: web2, daddr: subnetBcast, proto: udp}.bytes(t)
	k.UplinkProgram().Run(&ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+64)})
	after, _ := k.Counters()
	// web1's vif is loopback here and takes its copy; web3's ifindex (42)
	// names no device in a test run, and a copy that cannot be sent is not
	// counted. The e2e tests prove delivery to every member.
	if d := after.Forwards["broadcast"] - before.Forwards["broadcast"]; d != 1 {
		t.Errorf("one subnet broadcast made %d deliverable copies, want 1", d)
	}
	// From a VM: out to the fabric with the scope's multicast MAC.
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "web1's subnet broadcast leaves with the subnet's multicast MAC",
			in:          frame{src: vmac(web1), dst: layers.EthernetBroadcast, saddr: web1, daddr: subnetBcast, proto: udp},
			wantVerdict: actRedirect, want: &frame{src: h1MAC, dst: mustMAC("03:00:0a:01:01:00"), saddr: web1, daddr: subnetBcast, proto: udp},
			wantTo: 7, wantClones: []uint32{42}, wantForward: "to_fabric"},
		{name: "multicast with ttl > 1 is farm-scoped",
			in:          frame{src: vmac(web1), dst: mustMAC("01:00:5e:01:02:03"), saddr: web1, daddr: group, proto: udp, ttl: 4},
			wantVerdict: actRedirect, want: &frame{src: h1MAC, dst: mustMAC("03:00:0a:01:00:00"), saddr: web1, daddr: group, proto: udp, ttl: 4},
			wantTo: 7, wantClones: []uint32{42}, wantForward: "to_fabric"},
	})
}

func TestPrivilegedMappingTableIsFixedSizeAndKeepsWhatIsInUse(t *testing.T) {
	const size = 64
	k := openTestKernel(t, Options{MappingTableSize: size, testHooks: true})
	if err := k.Apply(compileTest(t, testDesired(), testIfindex), ""); err != nil {
		t.Fatal(err)
	}
	if k.MappingCapacity() != size {
		t.Fatalf("capacity %d, want %d", k.MappingCapacity(), size)
	}
	// Four times as many remote VMs as entries speak to web1, while web1
	// keeps talking to the first of them: the table stays at its size, and
	// the entry in use survives (a lookup refreshes it).
	busy := netip.MustParseAddr("10.1.1.10")
	send := func(prog *ebpf.Program, f frame) {
		in := f.bytes(t)
		if _, err := prog.Run(&ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+64)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 4*size; i++ {
		src := netip.AddrFrom4([4]byte{10, 1, 1, byte(10 + i%200)})
		if i >= 200 {
			src = netip.AddrFrom4([4]byte{10, 1, 3, byte(i - 190)})
		}
		send(k.UplinkProgram(), frame{src: h2MAC, dst: h1MAC, saddr: src, daddr: web1, proto: layers.IPProtocolICMPv4})
		send(k.VifProgram(), frame{src: vmac(web1), dst: vmac(busy), saddr: web1, daddr: busy, proto: layers.IPProtocolICMPv4})
	}
	entries, err := k.Mappings()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) > size {
		t.Fatalf("%d entries in a table of %d", len(entries), size)
	}
	if got := mappingOf(k, busy); got != h2MAC.String() {
		t.Fatalf("the entry in use was evicted (now %q)", got)
	}
}

func TestPrivilegedChangedRulesMakeEveryFlowEarnItsAdmissionAgain(t *testing.T) {
	k := loadTestKernel(t)
	syn := frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db1, proto: layers.IPProtocolTCP, dport: 5432}
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "web1 -> db1:5432 is admitted", in: syn, wantVerdict: actRedirect,
			want:   &frame{src: h1MAC, dst: h2MAC, saddr: web1, daddr: db1, proto: layers.IPProtocolTCP, dport: 5432, ttl: 63},
			wantTo: 7, wantForward: "to_fabric,routed"},
	})
	// The farm owner withdraws web -> db.
	d := testDesired()
	d.Visibility = d.Visibility[1:]
	if err := k.Apply(compileTest(t, d, testIfindex), ""); err != nil {
		t.Fatal(err)
	}
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "the same flow's next packet is refused", in: syn, wantVerdict: actShot, wantDrop: "not_visible"},
	})
}

func TestPrivilegedAnUnrelatedRuleChangeKeepsAllowedFlowsAndTheirReplies(t *testing.T) {
	k := loadTestKernel(t)
	tcp := layers.IPProtocolTCP
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "web1 -> db1:5432 is admitted",
			in:          frame{src: vmac(web1), dst: vmac(gw), saddr: web1, daddr: db1, proto: tcp, dport: 5432},
			wantVerdict: actRedirect, want: &frame{src: h1MAC, dst: h2MAC, saddr: web1, daddr: db1, proto: tcp, dport: 5432, ttl: 63},
			wantTo: 7, wantForward: "to_fabric,routed"},
	})
	// Another rule appears (say another tenant's): the epoch moves on.
	d := testDesired()
	d.Visibility = append(d.Visibility, intent.VisRule{SrcFarm: 2, SrcSubnet: 1, DstFarm: 2, DstSubnet: 2, Proto: 17, Port: 53})
	if err := k.Apply(compileTest(t, d, testIfindex), ""); err != nil {
		t.Fatal(err)
	}
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "db1's reply still comes in: the flow it answers is still allowed",
			in:          frame{src: h2MAC, dst: h1MAC, saddr: db1, daddr: web1, proto: tcp, sport: 5432, dport: 40000},
			wantVerdict: actRedirect, want: &frame{src: vmac(gw), dst: vmac(web1), saddr: db1, daddr: web1, proto: tcp, sport: 5432, dport: 40000},
			wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
	})
}
