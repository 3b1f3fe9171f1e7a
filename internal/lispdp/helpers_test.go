package lispdp

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/csum"
	"github.com/onehop/onehop/internal/testenv"
)

var (
	macGW   = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01} // the node's own (inner frame's source)
	macRtr  = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02} // the routed next hop (inner frame's destination)
	macP1   = net.HardwareAddr{0x02, 0, 0, 0, 1, 0x01} // path 1's interface
	macP1nh = net.HardwareAddr{0x02, 0, 0, 0, 1, 0x02} // path 1's next hop
	macP2   = net.HardwareAddr{0x02, 0, 0, 0, 2, 0x01}
	macP2nh = net.HardwareAddr{0x02, 0, 0, 0, 2, 0x02}
)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

// inner describes an IPv4 packet to build; zero fields take defaults.
type inner struct {
	proto      layers.IPProtocol // TCP, UDP or ICMPv4
	src, dst   string
	sport      uint16
	dport      uint16
	payload    int // bytes of payload
	body       string
	ttl        uint8
	tos        uint8
	moreFrags  bool
	fragOffset uint16
	version    uint8 // 0: 4
}

// ip builds the IPv4 packet (no Ethernet), every checksum right.
func (p inner) ip(t testing.TB) []byte {
	t.Helper()
	ttl := p.ttl
	if ttl == 0 {
		ttl = 64
	}
	ip := &layers.IPv4{Version: 4, IHL: 5, TTL: ttl, TOS: p.tos, Id: 0x4242, Protocol: p.proto,
		SrcIP: addr(p.src).AsSlice(), DstIP: addr(p.dst).AsSlice(), FragOffset: p.fragOffset}
	if p.moreFrags {
		ip.Flags |= layers.IPv4MoreFragments
	} else if p.proto == layers.IPProtocolTCP {
		ip.Flags |= layers.IPv4DontFragment
	}
	var l4 gopacket.SerializableLayer
	switch p.proto {
	case layers.IPProtocolTCP:
		tcp := &layers.TCP{SrcPort: layers.TCPPort(p.sport), DstPort: layers.TCPPort(p.dport), Seq: 1000, Ack: 1,
			ACK: true, PSH: true, Window: 64240}
		if err := tcp.SetNetworkLayerForChecksum(ip); err != nil {
			t.Fatal(err)
		}
		l4 = tcp
	case layers.IPProtocolUDP:
		udp := &layers.UDP{SrcPort: layers.UDPPort(p.sport), DstPort: layers.UDPPort(p.dport)}
		if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
			t.Fatal(err)
		}
		l4 = udp
	default:
		ip.Protocol = layers.IPProtocolICMPv4
		l4 = &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 7, Seq: 1}
	}
	body := []byte(p.body)
	if p.payload > len(body) {
		body = append(body, bytes.Repeat([]byte{'x'}, p.payload-len(body))...)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		ip, l4, gopacket.Payload(body)); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if p.version != 0 {
		b[0] = p.version<<4 | b[0]&0x0f
	}
	return b
}

// frame puts Ethernet in front of an IPv4 packet.
func frame(dst, src net.HardwareAddr, ip []byte) []byte {
	f := make([]byte, 0, 14+len(ip))
	f = append(f, dst...)
	f = append(f, src...)
	f = append(f, 0x08, 0x00)
	return append(f, ip...)
}

// outer describes the LISP headers of an encapsulated packet.
type outer struct {
	src, dst string
	sport    uint16
	ttl, tos uint8
	flags    uint8 // LISP first byte
	nonce    uint32
	iidLSB   uint32
	frag     uint16 // flags+offset word; 0: DF
	lenDelta int    // added to the outer lengths (malformed rows)
}

// encap builds outer IPv4 + UDP 4341 + LISP around an inner IPv4 packet,
// byte by byte from RFC 9300 §5.3.
func (o outer) encap(innerIP []byte) []byte {
	h := make([]byte, 36)
	total := 36 + len(innerIP) + o.lenDelta
	h[0] = 0x45
	h[1] = o.tos
	binary.BigEndian.PutUint16(h[2:], uint16(total))
	frag := o.frag
	if frag == 0 {
		frag = 0x4000
	}
	binary.BigEndian.PutUint16(h[6:], frag)
	h[8] = o.ttl
	h[9] = 17
	s, d := addr(o.src).As4(), addr(o.dst).As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	csum.SetIPv4(h)
	binary.BigEndian.PutUint16(h[20:], o.sport)
	binary.BigEndian.PutUint16(h[22:], DataPort)
	binary.BigEndian.PutUint16(h[24:], uint16(total-20))
	h[28] = o.flags
	h[29], h[30], h[31] = byte(o.nonce>>16), byte(o.nonce>>8), byte(o.nonce)
	binary.BigEndian.PutUint32(h[32:], o.iidLSB)
	return append(h, innerIP...)
}

// run passes frame through prog with BPF_PROG_RUN and returns the verdict
// and the frame as the program left it.
func run(t testing.TB, prog *ebpf.Program, frame []byte) (int32, []byte) {
	t.Helper()
	out := make([]byte, len(frame)+256)
	opts := &ebpf.RunOptions{Data: frame, DataOut: out}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_RUN on %d bytes: %v", len(frame), err)
	}
	return int32(ret), opts.DataOut
}

// skbCtx is struct __sk_buff as BPF_PROG_RUN takes it, with only the GSO
// fields the kernel lets a test set (offsets from the uapi header).
type skbCtx struct {
	_       [164]byte
	GSOSegs uint32
	_       [8]byte
	GSOSize uint32
	_       [12]byte
}

// runGSO is run with the packet marked as a GSO superpacket; it returns
// the gso_size the program left.
func runGSO(t testing.TB, prog *ebpf.Program, frame []byte, size, segs uint32) (int32, []byte, uint32) {
	t.Helper()
	out := make([]byte, len(frame)+256)
	in := skbCtx{GSOSegs: segs, GSOSize: size}
	var ctxOut skbCtx
	opts := &ebpf.RunOptions{Data: frame, DataOut: out, Context: in, ContextOut: &ctxOut}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_RUN (gso_size %d) on %d bytes: %v", size, len(frame), err)
	}
	return int32(ret), opts.DataOut, ctxOut.GSOSize
}

func open(t testing.TB, o Options) *Kernel {
	t.Helper()
	testenv.RequireRoot(t, "BPF programs")
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

// counterDelta returns after-before for every counter that moved.
func counterDelta(before, after map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range after {
		if v != before[k] {
			out[k] = v - before[k]
		}
	}
	return out
}

func counters(t testing.TB, d *Kernel) map[string]uint64 {
	t.Helper()
	c, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// onePath maps the pair's far EIDs over path 1 both ways: the gateway
// sends 10.2.0.0/16 on it from its pinned 10.1.0.11, the xTR takes
// 10.1.0.0/16 from it (and answers on it).
func onePath(t testing.TB, gw, xtr *Kernel) {
	t.Helper()
	one := []PathChoice{{ID: 1, Priority: 1, Weight: 1}}
	for _, err := range []error{
		gw.SetEID(netip.MustParsePrefix("10.2.0.0/16"), one),
		gw.PinSource(addr("10.1.0.11"), 1),
		xtr.SetEID(netip.MustParsePrefix("10.1.0.0/16"), one),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// wholeDecaps checks that d decapsulated at least n bytes on path 1 since
// c0 and s0 (counters, pathStats), some superpackets whole: fewer
// decapsulations than segments, decap_local_gso counted.
func wholeDecaps(t *testing.T, what string, d *Kernel, c0 map[string]uint64, s0 map[uint8]Stats, n uint64) {
	t.Helper()
	c, s := counterDelta(c0, counters(t, d)), sub(pathStats(t, d), s0)[1]
	t.Logf("%s: counters %v; path 1 received %d segments, %d bytes", what, c, s.RxPackets, s.RxBytes)
	if s.RxBytes < n {
		t.Errorf("%s: path 1 decapsulated %d bytes, want >= %d", what, s.RxBytes, n)
	}
	if c["decap_local_gso"] == 0 || c["decapsulated"] >= s.RxPackets {
		t.Errorf("%s: no superpacket decapsulated whole: decap_local_gso %d, %d decapsulations for %d segments", what, c["decap_local_gso"], c["decapsulated"], s.RxPackets)
	}
}

// noDrops fails t for every drop counter of ds that is not 0.
func noDrops(t testing.TB, what string, ds ...*Kernel) {
	t.Helper()
	for _, d := range ds {
		drops, err := d.Drops()
		if err != nil {
			t.Fatal(err)
		}
		for r, v := range drops {
			if v != 0 {
				t.Errorf("%s: dropped %d: %s", what, v, r)
			}
		}
	}
}
