package arpengine

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/csum"
)

// The frames this package reads come from outside the host's trust: ARP
// answers and claims from the fabric (ParseAnswer) and packets a VM sent
// that the datapath hands over to be held (Hold, Destination,
// FinishChecksum). Fuzzed, none may panic, malformed input is an error, and
// what is accepted is read and rewritten exactly as the doc comments say.

// udpFrame is the datagram of TestFinishChecksumMakesTCPAndUDPWhole.
func udpFrame() []byte {
	f := make([]byte, 14+20+8+2)
	f[12], f[13] = 0x08, 0x00
	ip := f[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:4], 30)
	copy(ip[12:16], []byte{10, 1, 1, 2})
	copy(ip[16:20], []byte{10, 1, 2, 2})
	udp := ip[20:]
	binary.BigEndian.PutUint16(udp[0:2], 40000)
	binary.BigEndian.PutUint16(udp[2:4], 53)
	binary.BigEndian.PutUint16(udp[4:6], 10)
	copy(udp[8:], "hi")
	binary.BigEndian.PutUint16(udp[6:8], 0x1234)
	return f
}

// tcpFrame is a TCP segment with an odd number of data bytes.
func tcpFrame() []byte {
	f := make([]byte, 14+20+20+3)
	f[12], f[13] = 0x08, 0x00
	ip := f[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, 6
	binary.BigEndian.PutUint16(ip[2:4], uint16(len(ip)))
	copy(ip[12:16], []byte{10, 1, 1, 2})
	copy(ip[16:20], []byte{10, 1, 2, 2})
	tcp := ip[20:]
	binary.BigEndian.PutUint16(tcp[0:2], 40000)
	binary.BigEndian.PutUint16(tcp[2:4], 5432)
	tcp[12] = 5 << 4
	copy(tcp[20:], "abc")
	return f
}

// frameSeeds are the frames of the table tests in engine_test.go, and their
// variants that must be refused.
func frameSeeds() [][]byte {
	good := Announcement(hostMAC, db1)
	notARP := append([]byte(nil), good...)
	notARP[12], notARP[13] = 0x08, 0x00
	frag := udpFrame()
	binary.BigEndian.PutUint16(frag[14+6:], 0x2000)
	return [][]byte{
		good, good[:30], notARP, frag, udpFrame(), tcpFrame(), heldFrame(db1, 1),
		Request(ScopeMAC(db1), hostMAC, hostIP, db1), Request(h2, hostMAC, hostIP, db1), nil,
	}
}

func FuzzParseAnswer(f *testing.F) {
	for _, s := range frameSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		in := append([]byte(nil), b...)
		a, err := ParseAnswer(b)
		if !bytes.Equal(b, in) {
			t.Fatal("ParseAnswer wrote to the frame")
		}
		isReply := len(b) >= arpFrameLen && binary.BigEndian.Uint16(b[12:14]) == etherTypeARP &&
			bytes.Equal(b[14:20], []byte{0, 1, 0x08, 0x00, 6, 4}) && binary.BigEndian.Uint16(b[20:22]) == arpReply
		if err != nil {
			if isReply || !strings.HasPrefix(err.Error(), "ARP reply: ") {
				t.Fatalf("refused % x with %q", b, err)
			}
			return
		}
		if !isReply {
			t.Fatalf("accepted what is no IPv4-over-Ethernet ARP reply: % x", b)
		}
		if a.VM != netip.AddrFrom4([4]byte(b[28:32])) || !bytes.Equal(a.HostMAC, b[6:12]) {
			t.Fatalf("answer %+v, want the sender address %v from %s", a, b[28:32], net.HardwareAddr(b[6:12]))
		}
		for i := range b {
			b[i] ^= 0xff
		}
		if !bytes.Equal(a.HostMAC, in[6:12]) {
			t.Fatal("the answer's host MAC aliases the frame")
		}
	})
}

// FuzzHold hands the engine a frame as the datapath does, lets the
// destination be answered (or already known), and checks every frame the
// engine sends: questions are ARP requests for the destination, and held
// frames leave as they came but for the destination MAC and a checksum that
// now verifies.
func FuzzHold(f *testing.F) {
	for _, s := range frameSeeds() {
		f.Add(s, uint16(0), false)
		f.Add(s, uint16(1), true)
	}
	f.Fuzz(func(t *testing.T, frame []byte, cut uint16, known bool) {
		in := append([]byte(nil), frame...)
		origLen := len(frame) + int(cut)
		r := newRig(t, Config{})
		dst, derr := Destination(frame)
		isIPv4 := len(frame) >= 34 && binary.BigEndian.Uint16(frame[12:14]) == etherTypeIPv4 && frame[14]>>4 == 4
		if (derr == nil) != isIPv4 {
			t.Fatalf("Destination(% x) = %v, %v", frame, dst, derr)
		}
		if derr == nil && dst != netip.AddrFrom4([4]byte(frame[30:34])) {
			t.Fatalf("Destination %v, want the IPv4 destination %v", dst, frame[30:34])
		}
		if known && derr == nil {
			r.table.entries[dst] = Entry{IP: dst, HostMAC: h3}
		}
		if err := r.e.Hold(frame, origLen); (err != nil) != (derr != nil) {
			t.Fatalf("Hold: %v; Destination: %v", err, derr)
		}
		if derr != nil {
			if len(r.sent) != 0 {
				t.Fatalf("sent %d frames for a frame that is not IPv4", len(r.sent))
			}
			return
		}
		mac := h3
		if !known {
			mac = h2
			for _, q := range r.takeSent() {
				a := q[14:]
				if len(q) != arpFrameLen || binary.BigEndian.Uint16(q[12:14]) != etherTypeARP ||
					binary.BigEndian.Uint16(a[6:8]) != arpRequest || netip.AddrFrom4([4]byte(a[24:28])) != dst {
					t.Fatalf("question % x is no ARP request for %v", q, dst)
				}
			}
			r.e.Answered(Answer{VM: dst, HostMAC: mac})
		}
		sent := r.takeSent()
		want := 0
		if cut == 0 {
			want = 1 // a frame cut short by the hand-over is not kept
		}
		if len(sent) != want {
			t.Fatalf("%d frames released of a %d-byte frame of %d, want %d", len(sent), len(frame), origLen, want)
		}
		for _, out := range sent {
			checkReleased(t, in, out, mac)
		}
	})
}

// checkReleased: out is in sent to mac, with its TCP/UDP checksum made
// whole where FinishChecksum's doc says it is, and nothing else changed.
func checkReleased(t *testing.T, in, out []byte, mac net.HardwareAddr) {
	t.Helper()
	if len(out) != len(in) || !bytes.Equal(out[0:6], mac) || !bytes.Equal(out[6:14], in[6:14]) {
		t.Fatalf("released % x\nfrom        % x\nwant it sent to %s", out, in, mac)
	}
	ip, ipOut := in[14:], out[14:]
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	field := -1
	if ip[0]>>4 == 4 && ihl >= 20 && total >= ihl && total <= len(ip) && binary.BigEndian.Uint16(ip[6:8])&0x3fff == 0 {
		switch l4 := total - ihl; {
		case ip[9] == 6 && l4 >= 20:
			field = ihl + 16
		case ip[9] == 17 && l4 >= 8:
			field = ihl + 6
		}
	}
	for i := range ip {
		if ip[i] != ipOut[i] && (field < 0 || i < field || i > field+1) {
			t.Fatalf("released frame differs at byte %d (checksum field at %d):\n got % x\nfrom % x", 14+i, 14+field, out, in)
		}
	}
	if field < 0 {
		return
	}
	l4 := ipOut[ihl:total]
	if sum := csum.Sum(csum.Pseudo(ipOut[12:16], ipOut[16:20], ip[9], len(l4)), l4); sum != 0xffff {
		t.Fatalf("released frame's checksum does not verify (sum %#x): % x", sum, out)
	}
}
