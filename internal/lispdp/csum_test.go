package lispdp

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// receiver is a namespace whose veth "dst" (checksum offload off, so the
// stack verifies every checksum itself) receives frames written to "inj".
type receiver struct {
	ns     string
	fd     int
	inj    int
	dstMAC net.HardwareAddr
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	p := newPair(t) // a1 (in A) - b1 (in B): frames go in at a1, arrive at b1
	r := &receiver{ns: p.b}
	for _, args := range [][]string{{p.a, "a1"}, {p.b, "b1"}} {
		p.sh(t, args[0], "ethtool", "-K", args[1], "rx", "off", "tx", "off")
	}
	r.dstMAC = p.link(t, p.hb, "b1").Attrs().HardwareAddr
	r.inj = p.link(t, p.ha, "a1").Attrs().Index
	if err := netns.Do(p.a, func() (err error) {
		r.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(r.fd) })
	return r
}

func (r *receiver) own(t *testing.T, cidr string) {
	t.Helper()
	netnstest.IP(t, r.ns, "addr", "add", cidr, "dev", "lo")
}

func (r *receiver) inject(t *testing.T, f []byte) {
	t.Helper()
	f = bytes.Clone(f)
	copy(f[0:6], r.dstMAC)
	if err := unix.Sendto(r.fd, f, 0, &unix.SockaddrLinklayer{Ifindex: r.inj}); err != nil {
		t.Fatal(err)
	}
}

func (r *receiver) listenUDP(t *testing.T, port int) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := netns.Do(r.ns, func() (err error) {
		c, err = net.ListenUDP("udp4", &net.UDPAddr{Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func readUDP(t *testing.T, c *net.UDPConn) []byte {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, _, err := c.ReadFromUDP(buf)
	if err != nil {
		t.Fatalf("nothing delivered: %v", err)
	}
	return buf[:n]
}

// TestPrivilegedEncapsulatedFramesAreAcceptedByTheKernel: every frame
// lisp_encap makes, injected into a namespace that owns its remote RLOC,
// reaches a UDP socket on 4341 whose payload is the LISP header and the
// inner packet unchanged (the kernel checked the outer IPv4 checksum and
// lengths, and took checksum 0). The same frame with the outer IPv4
// checksum spoiled is counted as a header error and not delivered.
func TestPrivilegedEncapsulatedFramesAreAcceptedByTheKernel(t *testing.T) {
	d := gateway(t)
	encap := d.Programs().Encap
	r := newReceiver(t)
	r.own(t, "198.51.100.1/32")
	r.own(t, "198.51.100.5/32")
	sock := r.listenUDP(t, DataPort)
	for _, in := range []inner{
		{proto: layers.IPProtocolTCP, src: "10.1.0.11", dst: "10.2.0.2", sport: 33000, dport: 80, body: "over path 1"},
		{proto: layers.IPProtocolUDP, src: "10.1.0.12", dst: "10.2.0.2", sport: 5353, dport: 53, body: "over path 2, iid 7"},
		{proto: layers.IPProtocolUDP, src: "10.1.0.11", dst: "10.2.0.2", sport: 1, dport: 9, payload: 1464 - 28},
	} {
		ip := in.ip(t)
		_, out := run(t, encap, frame(macRtr, macGW, ip))
		r.inject(t, out)
		got := readUDP(t, sock)
		if len(got) < 8 || !bytes.Equal(got[8:], ip) {
			t.Errorf("%s: payload after the LISP header differs from the inner packet", in.body)
		}
		hdrErrs := netnstest.SNMP(t, r.ns, "Ip", "InHdrErrors")
		bad := bytes.Clone(out)
		bad[14+10] ^= 0x5a
		r.inject(t, bad)
		testenv.Eventually(t, "the spoiled copy counted as a header error", 3*time.Second, func() bool { return netnstest.SNMP(t, r.ns, "Ip", "InHdrErrors") > hdrErrs })
	}
}

// TestPrivilegedDecapsulatedFramesAreAcceptedByTheKernel: inner packets
// lisp_decap hands on, including those whose TTL or ECN it rewrote (an
// incremental checksum update), are taken by the stack of a namespace that
// owns their destination: UDP reaches its socket, TCP is answered with a
// reset (only sent for a valid checksum); no checksum error is counted.
func TestPrivilegedDecapsulatedFramesAreAcceptedByTheKernel(t *testing.T) {
	d := gateway(t)
	decap := d.Programs().Decap
	r := newReceiver(t)
	r.own(t, "10.1.0.11/32")
	r.own(t, "10.1.0.12/32")
	// The server side of these packets is 10.9.0.2 (the pair's B already
	// owns 10.2.0.2, which would make it a martian here); resets go back
	// towards it.
	netnstest.IP(t, r.ns, "route", "add", "10.9.0.0/16", "via", "192.0.2.1")
	// ... and a mapping puts it behind both paths' remote RLOCs, or
	// decapsulation would refuse it as a source.
	if err := d.SetEID(netip.MustParsePrefix("10.9.0.0/16"), []PathChoice{{ID: 1, Priority: 1, Weight: 1}, {ID: 2, Priority: 1, Weight: 1}}); err != nil {
		t.Fatal(err)
	}
	sock := r.listenUDP(t, 5353)
	o1 := outer{src: "198.51.100.1", dst: "192.0.2.1", sport: 50000, ttl: 64, flags: 0x80}
	o2 := outer{src: "198.51.100.5", dst: "192.0.2.5", sport: 50001, ttl: 64, flags: 0x88, iidLSB: 7 << 8}
	lowTTL, ce := o1, o2
	lowTTL.ttl = 5
	ce.tos = 3
	for _, tc := range []struct {
		name string
		o    outer
		in   inner
	}{
		{"tcp", o1, inner{proto: layers.IPProtocolTCP, src: "10.9.0.2", dst: "10.1.0.11", sport: 80, dport: 33000}},
		{"udp", o2, inner{proto: layers.IPProtocolUDP, src: "10.9.0.2", dst: "10.1.0.12", sport: 53, dport: 5353, body: "udp"}},
		{"tcp, TTL lowered", lowTTL, inner{proto: layers.IPProtocolTCP, src: "10.9.0.2", dst: "10.1.0.11", sport: 80, dport: 33001}},
		{"udp, CE marked", ce, inner{proto: layers.IPProtocolUDP, src: "10.9.0.2", dst: "10.1.0.12", sport: 53, dport: 5353, tos: 2, body: "ce"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			verdict, out := run(t, decap, frame(macGW, macP1nh, tc.o.encap(tc.in.ip(t))))
			if verdict != verdictNext {
				t.Fatalf("verdict %d", verdict)
			}
			proto := "Udp"
			if tc.in.proto == layers.IPProtocolTCP {
				proto = "Tcp"
			}
			csumErrs, hdrErrs := netnstest.SNMP(t, r.ns, proto, "InCsumErrors"), netnstest.SNMP(t, r.ns, "Ip", "InHdrErrors")
			rsts := netnstest.SNMP(t, r.ns, "Tcp", "OutRsts")
			r.inject(t, out)
			if tc.in.proto == layers.IPProtocolUDP {
				if got := readUDP(t, sock); string(got) != tc.in.body {
					t.Errorf("delivered %q, want %q", got, tc.in.body)
				}
			} else {
				testenv.Eventually(t, "a reset for the decapsulated segment", 3*time.Second, func() bool { return netnstest.SNMP(t, r.ns, "Tcp", "OutRsts") > rsts })
			}
			if netnstest.SNMP(t, r.ns, proto, "InCsumErrors") != csumErrs || netnstest.SNMP(t, r.ns, "Ip", "InHdrErrors") != hdrErrs {
				t.Error("checksum or header errors counted")
			}
		})
	}
}

// TestPrivilegedTsharkDecodesEncapsulatedFramesAsLISP: Wireshark's own
// dissector (lisp-data on UDP 4341) reads the frames lisp_encap makes:
// flags, instance id, outer and inner addresses, every checksum good.
func TestPrivilegedTsharkDecodesEncapsulatedFramesAsLISP(t *testing.T) {
	testenv.RequireTool(t, "tshark")
	d := gateway(t)
	encap := d.Programs().Encap
	file := filepath.Join(t.TempDir(), "lisp.pcap")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	w := pcapgo.NewWriter(f)
	if err := w.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	for _, in := range []inner{
		{proto: layers.IPProtocolTCP, src: "10.1.0.11", dst: "10.2.0.2", sport: 33000, dport: 80, body: "path 1"},
		{proto: layers.IPProtocolUDP, src: "10.1.0.12", dst: "10.2.0.2", sport: 5353, dport: 53, body: "path 2"},
	} {
		_, out := run(t, encap, frame(macRtr, macGW, in.ip(t)))
		if err := w.WritePacket(captureInfo(len(out)), out); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("tshark", "-r", file, "-o", "ip.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE",
		"-o", "udp.check_checksum:TRUE", "-T", "fields", "-E", "separator=|",
		"-e", "lisp-data.flags.nonce", "-e", "lisp-data.flags.iid", "-e", "lisp-data.iid",
		"-e", "ip.src", "-e", "ip.dst", "-e", "ip.checksum.status", "-e", "udp.dstport",
		"-e", "tcp.checksum.status", "-e", "udp.checksum.status").Output()
	if err != nil {
		t.Fatalf("tshark: %v: %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	want := []string{
		// N | I | iid | outer,inner src | outer,inner dst | both IPv4 checksums good (1) |
		// UDP dst ports | TCP checksum good | outer UDP checksum not present (3), inner good
		"1|0||192.0.2.1,10.1.0.11|198.51.100.1,10.2.0.2|1,1|4341|1|3",
		"1|1|7|192.0.2.5,10.1.0.12|198.51.100.5,10.2.0.2|1,1|4341,53||3,1",
	}
	if len(lines) != len(want) {
		t.Fatalf("tshark printed %d lines, want %d:\n%s", len(lines), len(want), out)
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("frame %d: tshark says\n %s\nwant\n %s", i+1, lines[i], want[i])
		}
	}
}

func captureInfo(n int) gopacket.CaptureInfo {
	return gopacket.CaptureInfo{Timestamp: time.Unix(1700000000, 0), CaptureLength: n, Length: n}
}
