package agent

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/csum"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/dhcp"
)

// What a VM sends reaches the agent as a slow-path record the datapath
// wrote around the VM's frame; the DHCP server then reads the frame. Fuzzed,
// neither may panic, malformed input is an error, and a reply is a
// well-formed frame to the VM from its gateway.

// dhcpFrame is discover's frame with another message type and options.
func dhcpFrame(typ byte, opts ...byte) []byte {
	f := discover(web1MAC)
	p := f[42:]
	p = append(p[:240], 53, 1, typ)
	p = append(append(p, opts...), 255)
	return udpFrame(web1MAC, net.HardwareAddr{255, 255, 255, 255, 255, 255}, netip.IPv4Unspecified(),
		netip.AddrFrom4([4]byte{255, 255, 255, 255}), 68, 67, p)
}

// dhcpSeeds are the frames of dhcpd_test.go and variants of them.
func dhcpSeeds() [][]byte {
	shortUDP := discover(web1MAC)
	binary.BigEndian.PutUint16(shortUDP[38:], 7) // UDP length under its header
	longUDP := discover(web1MAC)
	binary.BigEndian.PutUint16(longUDP[38:], 2000) // past the frame
	options := discover(web1MAC)
	options[14] = 0x46 // an IPv4 option word: the UDP header moves
	return [][]byte{
		discover(web1MAC), discover(net.HardwareAddr{2, 0, 10, 1, 1, 9}), {1, 2, 3},
		dhcpFrame(dhcp.Request, 50, 4, 10, 1, 1, 2), dhcpFrame(dhcp.Request, 50, 4, 10, 1, 1, 9),
		dhcpFrame(dhcp.Request, 50, 4, 10, 1, 1, 2, 54, 4, 192, 168, 0, 1), dhcpFrame(dhcp.Release),
		dhcpFrame(dhcp.Inform), shortUDP, longUDP, options, discover(web1MAC)[:60],
	}
}

func FuzzDHCPServerHandle(f *testing.F) {
	for _, s := range dhcpSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		if reply, err := server().Handle(6, frame); err == nil || reply != nil {
			t.Fatalf("answered on a vif with no VM: %v", err)
		}
		in := append([]byte(nil), frame...)
		reply, err := server().Handle(5, frame)
		if !bytes.Equal(frame, in) {
			t.Fatal("Handle wrote to the VM's frame")
		}
		if err != nil {
			if reply != nil || !strings.HasPrefix(err.Error(), "dhcp from "+web1.Name+": ") {
				t.Fatalf("refused with %d bytes of reply and error %q; want none and an error naming the VM", len(reply), err)
			}
			return
		}
		if reply == nil {
			return // release, decline, another server's offer
		}
		checkDHCPReplyFrame(t, frame, reply)
	})
}

// checkDHCPReplyFrame: reply is Ethernet/IPv4/UDP from web1's gateway to
// web1's MAC, server port to client port, with a valid IPv4 header and
// lengths, around a BOOTREPLY to web1's transaction.
func checkDHCPReplyFrame(t *testing.T, request, reply []byte) {
	t.Helper()
	gw := net.HardwareAddr{0x02, 0x00, 10, 1, 1, 1}
	if len(reply) < 14+20+8+240 || !bytes.Equal(reply[0:6], web1MAC) || !bytes.Equal(reply[6:12], gw) ||
		binary.BigEndian.Uint16(reply[12:14]) != 0x0800 {
		t.Fatalf("reply frame header % x", reply[:min(len(reply), 14)])
	}
	ip := reply[14:34]
	if ip[0] != 0x45 || csum.Checksum(ip) != 0 || int(binary.BigEndian.Uint16(ip[2:4])) != len(reply)-14 || ip[9] != 17 ||
		netip.AddrFrom4([4]byte(ip[12:16])) != netip.MustParseAddr("10.1.1.1") || !bytes.Equal(ip[16:20], []byte{255, 255, 255, 255}) {
		t.Fatalf("reply IPv4 header % x", ip)
	}
	udp := reply[34:42]
	if binary.BigEndian.Uint16(udp[0:2]) != 67 || binary.BigEndian.Uint16(udp[2:4]) != 68 ||
		int(binary.BigEndian.Uint16(udp[4:6])) != len(reply)-34 {
		t.Fatalf("reply UDP header % x", udp)
	}
	asked, err := udpPayload(request)
	if err != nil {
		t.Fatalf("answered a request whose payload cannot be read: %v", err)
	}
	p := reply[42:]
	if p[0] != 2 || !bytes.Equal(p[4:8], asked[4:8]) || !bytes.Equal(p[28:34], web1MAC) {
		t.Fatalf("reply op %d xid % x chaddr % x; want a BOOTREPLY to xid % x for web1", p[0], p[4:8], p[28:34], asked[4:8])
	}
}

// slowRecord is a struct slowpath_event (bpf/lib/common.h) around frame as
// the datapath writes it, through its generated Go twin; n is the length it
// claims to hold.
func slowRecord(kind datapath.SlowpathKind, ifindex uint32, frame []byte, n, origLen uint32) []byte {
	ev := datapath.SlowpathEvent{Kind: uint32(kind), Ifindex: ifindex, Len: n, OrigLen: origLen}
	copy(ev.Data[:], frame)
	var buf bytes.Buffer
	if err := binary.Write(&buf, binary.NativeEndian, &ev); err != nil {
		panic(err) // a fixed-size struct into memory: cannot fail
	}
	return buf.Bytes()
}

func FuzzSlowPathRecord(f *testing.F) {
	for _, s := range dhcpSeeds() {
		f.Add(slowRecord(datapath.SlowDHCP, 5, s, uint32(len(s)), uint32(len(s))))
	}
	d := discover(web1MAC)
	n := uint32(len(d))
	f.Add(slowRecord(datapath.SlowHold, 5, d, n, 9000))
	f.Add(slowRecord(datapath.SlowARPReply, 2, d, n, 10))           // more than its frame
	f.Add(slowRecord(datapath.SlowDHCP, 5, d, 5000, 5000))          // more than a record holds
	f.Add(slowRecord(datapath.SlowDHCP, 5, d, n, n)[:100])          // cut short by the ring
	f.Add(slowRecord(datapath.SlowMappingClaim, 2, nil, 0, 0)[:15]) // shorter than its header
	f.Add(slowRecord(datapath.SlowpathKind(7), 2, d, n, n))         // a kind the agent does not know
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := decodeSlowPath(b)
		if err != nil {
			return
		}
		if len(ev.frame) > len(b) || ev.origLen < len(ev.frame) {
			t.Fatalf("a %d-byte record decoded to a %d-byte frame of %d", len(b), len(ev.frame), ev.origLen)
		}
		// What Serve hands each kind's reader must not panic either.
		if _, err := server().Handle(5, ev.frame); err != nil && !strings.HasPrefix(err.Error(), "dhcp from") {
			t.Fatalf("DHCP error %q names no VM", err)
		}
	})
}
