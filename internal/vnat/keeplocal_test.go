package vnat

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/netns"
)

// TestPrivilegedKeptLocalAddressIsUsableButNotAnsweredByARP: after
// KeepLocal, the old address is local (a socket can bind it) yet an ARP
// request for it gets no answer, while one for the interface's own address
// does (the capture is live); with arp_ignore back at 0 the kernel would
// answer it (the test can fail).
func TestPrivilegedKeptLocalAddressIsUsableButNotAnsweredByARP(t *testing.T) {
	a, b := linkedNS(t, "10.7.0.1/24", "10.7.0.3/24")
	db := openIn(t, b, Options{})
	kept := netip.MustParseAddr("10.7.0.2")
	if err := db.KeepLocal(kept, "b0"); err != nil {
		t.Fatal(err)
	}
	if err := netns.Do(b.name, func() error {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: kept.AsSlice(), Port: 7000})
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		t.Fatalf("bind the kept address: %v", err)
	}

	a0, err := a.h.LinkByName("a0")
	if err != nil {
		t.Fatal(err)
	}
	var fd int
	proto := int(htons(unix.ETH_P_ARP))
	if err := netns.Do(a.name, func() (err error) {
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, proto)
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: a0.Attrs().Index})
	}); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	mac := a0.Attrs().HardwareAddr
	answered := func(target string) bool {
		t.Helper()
		buf := gopacket.NewSerializeBuffer()
		tip := netip.MustParseAddr(target).AsSlice()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true},
			&layers.Ethernet{SrcMAC: mac, DstMAC: layers.EthernetBroadcast, EthernetType: layers.EthernetTypeARP},
			&layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
				Operation: layers.ARPRequest, SourceHwAddress: mac, SourceProtAddress: []byte{10, 7, 0, 1},
				DstHwAddress: make([]byte, 6), DstProtAddress: tip}); err != nil {
			t.Fatal(err)
		}
		if err := unix.Sendto(fd, buf.Bytes(), 0, &unix.SockaddrLinklayer{Ifindex: a0.Attrs().Index}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(500 * time.Millisecond)
		for time.Now().Before(deadline) {
			tv := unix.NsecToTimeval(int64(time.Until(deadline)))
			if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
				t.Fatal(err)
			}
			frame := make([]byte, 1500)
			n, _, err := unix.Recvfrom(fd, frame, 0)
			if err != nil {
				return false
			}
			p := gopacket.NewPacket(frame[:n], layers.LayerTypeEthernet, gopacket.Default)
			if arp, ok := p.Layer(layers.LayerTypeARP).(*layers.ARP); ok &&
				arp.Operation == layers.ARPReply && bytes.Equal(arp.SourceProtAddress, tip) {
				return true
			}
		}
		return false
	}
	if !answered("10.7.0.3") {
		t.Fatal("no ARP reply for the interface's own address: the capture is not live")
	}
	if answered(kept.String()) {
		t.Error("the kept address was announced: ARP answered for it")
	}
	b.sh(t, "sysctl", "-qw", "net.ipv4.conf.all.arp_ignore=0", "net.ipv4.conf.b0.arp_ignore=0")
	if !answered(kept.String()) {
		t.Error("with arp_ignore=0 the kept address is still not answered: the check above proves nothing")
	}
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}
