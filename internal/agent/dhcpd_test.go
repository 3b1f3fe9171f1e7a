package agent

import (
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/csum"
	"github.com/onehop/onehop/internal/intent"
)

var web1 = intent.LocalEndpoint{Name: "blue/web/web1", IP: "10.1.1.2", MAC: "02:00:0a:01:01:02", Interface: "vif-web1"}

// web1MAC is web1.MAC as bytes.
var web1MAC = net.HardwareAddr{0x02, 0x00, 0x0a, 0x01, 0x01, 0x02}

func discover(chaddr net.HardwareAddr) []byte {
	p := make([]byte, 240)
	p[0], p[1], p[2] = 1, 1, 6
	binary.BigEndian.PutUint32(p[4:], 42)
	copy(p[28:], chaddr)
	binary.BigEndian.PutUint32(p[236:], 0x63825363)
	p = append(p, 53, 1, 1, 255)
	return udpFrame(web1MAC, net.HardwareAddr{255, 255, 255, 255, 255, 255}, netip.IPv4Unspecified(),
		netip.AddrFrom4([4]byte{255, 255, 255, 255}), 68, 67, p)
}

func server() *DHCPServer {
	return &DHCPServer{Local: func(ifindex int) (intent.LocalEndpoint, bool) { return web1, ifindex == 5 }}
}

func TestDHCPDiscoverIsOfferedTheVMsAddressFromItsGateway(t *testing.T) {
	reply, err := server().Handle(5, discover(web1MAC))
	if err != nil {
		t.Fatal(err)
	}
	if net.HardwareAddr(reply[0:6]).String() != web1.MAC || net.HardwareAddr(reply[6:12]).String() != "02:00:0a:01:01:01" {
		t.Fatalf("ethernet %x", reply[:12])
	}
	if csum.Checksum(reply[14:34]) != 0 {
		t.Fatal("bad IPv4 header checksum")
	}
	if netip.AddrFrom4([4]byte(reply[26:30])).String() != "10.1.1.1" {
		t.Fatalf("not from the gateway: %v", reply[26:30])
	}
	payload, err := udpPayload(reply)
	if err != nil {
		t.Fatal(err)
	}
	if got := netip.AddrFrom4([4]byte(payload[16:20])).String(); got != "10.1.1.2" {
		t.Fatalf("offered %s", got)
	}
}

func TestDHCPForAnotherHardwareAddressOrUnknownVifIsRefused(t *testing.T) {
	if _, err := server().Handle(5, discover(net.HardwareAddr{2, 0, 10, 1, 1, 9})); err == nil || !strings.Contains(err.Error(), "not its own") {
		t.Fatalf("err = %v", err)
	}
	if _, err := server().Handle(6, discover(web1MAC)); err == nil {
		t.Fatal("answered on a vif with no VM")
	}
	if _, err := server().Handle(5, []byte{1, 2, 3}); err == nil {
		t.Fatal("accepted a runt frame")
	}
}
