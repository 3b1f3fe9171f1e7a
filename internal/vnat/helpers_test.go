package vnat

import (
	"bytes"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

var (
	macA = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x0a}
	macB = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x0b}
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// pkt describes a frame to build; zero fields take defaults.
type pkt struct {
	proto      Proto // 0: ICMP echo
	src, dst   netip.AddrPort
	payload    string
	udpNoCsum  bool   // UDP checksum 0 (none)
	fragOffset uint16 // in 8-byte units
	moreFrags  bool
	syn        bool
	seq        uint32
}

// build makes an Ethernet frame with every checksum right (gopacket's
// arithmetic; tests that prove checksums ask the kernel instead).
func (p pkt) build(t testing.TB) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: macA, DstMAC: macB, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Id: 0x1234,
		SrcIP: p.src.Addr().AsSlice(), DstIP: p.dst.Addr().AsSlice(), FragOffset: p.fragOffset}
	if p.moreFrags {
		ip.Flags |= layers.IPv4MoreFragments
	}
	var l4 []gopacket.SerializableLayer
	switch p.proto {
	case TCP:
		ip.Protocol = layers.IPProtocolTCP
		ip.Flags |= layers.IPv4DontFragment
		tcp := &layers.TCP{SrcPort: layers.TCPPort(p.src.Port()), DstPort: layers.TCPPort(p.dst.Port()),
			Seq: p.seq, Window: 64240, SYN: p.syn, ACK: !p.syn, PSH: !p.syn}
		if !p.syn {
			tcp.Ack = 1
		}
		if err := tcp.SetNetworkLayerForChecksum(ip); err != nil {
			t.Fatal(err)
		}
		l4 = append(l4, tcp)
	case UDP:
		ip.Protocol = layers.IPProtocolUDP
		udp := &layers.UDP{SrcPort: layers.UDPPort(p.src.Port()), DstPort: layers.UDPPort(p.dst.Port())}
		if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
			t.Fatal(err)
		}
		l4 = append(l4, udp)
	default:
		ip.Protocol = layers.IPProtocolICMPv4
		l4 = append(l4, &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 7, Seq: 1})
	}
	buf := gopacket.NewSerializeBuffer()
	ls := append([]gopacket.SerializableLayer{eth, ip}, l4...)
	ls = append(ls, gopacket.Payload(p.payload))
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if p.proto == UDP && p.udpNoCsum {
		b[14+20+6], b[14+20+7] = 0, 0
	}
	return b
}

func arpFrame(t testing.TB) []byte {
	t.Helper()
	buf := gopacket.NewSerializeBuffer()
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true},
		&layers.Ethernet{SrcMAC: macA, DstMAC: layers.EthernetBroadcast, EthernetType: layers.EthernetTypeARP},
		&layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
			Operation: layers.ARPRequest, SourceHwAddress: macA, SourceProtAddress: []byte{10, 9, 1, 2},
			DstHwAddress: make([]byte, 6), DstProtAddress: []byte{10, 9, 2, 2}})
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// run passes frame through prog with BPF_PROG_RUN and returns the verdict
// and the frame as the program left it.
func run(t testing.TB, prog *ebpf.Program, frame []byte) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(frame)+256)
	opts := &ebpf.RunOptions{Data: frame, DataOut: out}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_RUN on %d bytes: %v", len(frame), err)
	}
	return ret, opts.DataOut
}

// testNS is a namespace with a veth pair vn0 (10.9.0.1/16) - vn1 (10.9.0.254/16),
// both inside, for the routes Translate installs.
type testNS struct {
	name, path string
	h          *netlink.Handle
}

func newTestNS(t testing.TB) *testNS {
	t.Helper()
	testenv.RequireRoot(t, "network namespaces and BPF")
	name := netnstest.New(t, "vnat-t")
	h, err := netns.Handle(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	n := &testNS{name: name, path: netns.Path(name), h: h}
	n.veth(t, "vn0", "10.9.0.1/16", "vn1", "10.9.0.254/16")
	return n
}

// linkedNS is two test namespaces (their own vn0/vn1 unused) joined by a
// veth: a0 with aAddr in a, b0 with bAddr in b.
func linkedNS(t testing.TB, aAddr, bAddr string) (a, b *testNS) {
	t.Helper()
	a, b = newTestNS(t), newTestNS(t)
	netnstest.Veth(t, "a0", a.name, "b0", b.name)
	netnstest.IP(t, a.name, "addr", "add", aAddr, "dev", "a0")
	netnstest.IP(t, b.name, "addr", "add", bAddr, "dev", "b0")
	return a, b
}

// injector is a test namespace with a veth whose frames go in at inj and
// arrive at dst, checksum offload off on both (so the stack verifies
// every checksum itself), and a packet socket to send on inj.
type injector struct {
	*testNS
	fd  int
	dst netlink.Link // where the frames arrive
	inj netlink.Link
}

func newInjector(t testing.TB) *injector {
	t.Helper()
	testenv.RequireTool(t, "ethtool", "ip")
	rx := &injector{testNS: newTestNS(t)}
	rx.veth(t, "inj", "", "dst", "")
	rx.sh(t, "ethtool", "-K", "dst", "rx", "off", "tx", "off")
	rx.sh(t, "ethtool", "-K", "inj", "rx", "off", "tx", "off")
	var err error
	if rx.dst, err = rx.h.LinkByName("dst"); err != nil {
		t.Fatal(err)
	}
	if rx.inj, err = rx.h.LinkByName("inj"); err != nil {
		t.Fatal(err)
	}
	if err := netns.Do(rx.name, func() (err error) {
		rx.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(rx.fd) })
	return rx
}

// inject sends a copy of f, addressed to dst's MAC, in at inj.
func (rx *injector) inject(t testing.TB, f []byte) {
	t.Helper()
	f = bytes.Clone(f)
	copy(f[0:6], rx.dst.Attrs().HardwareAddr)
	if err := unix.Sendto(rx.fd, f, 0, &unix.SockaddrLinklayer{Ifindex: rx.inj.Attrs().Index}); err != nil {
		t.Fatal(err)
	}
}

func (n *testNS) veth(t testing.TB, a, aAddr, b, bAddr string) {
	t.Helper()
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a}, PeerName: b}
	if err := n.h.LinkAdd(v); err != nil {
		t.Fatalf("veth %s: %v", a, err)
	}
	for name, addr := range map[string]string{a: aAddr, b: bAddr} {
		l, err := n.h.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if addr != "" {
			pfx, err := netlink.ParseAddr(addr)
			if err != nil {
				t.Fatal(err)
			}
			if err := n.h.AddrAdd(l, pfx); err != nil {
				t.Fatalf("addr %s on %s: %v", addr, name, err)
			}
		}
		if err := n.h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
}

// sh runs a command inside the namespace and returns its output.
func (n *testNS) sh(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", n.name}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s in %s: %v: %s", strings.Join(args, " "), n.name, err, out)
	}
	return string(out)
}

func openIn(t testing.TB, n *testNS, o Options) *Kernel {
	t.Helper()
	o.Netns = n.path
	d, err := Open(o)
	if err != nil {
		t.Fatalf("%+v", err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	return d
}
