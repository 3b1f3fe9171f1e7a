package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/csum"
	"github.com/onehop/onehop/internal/dhcp"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ipam"
)

// LeaseTime is long on purpose (paper §2): a VM keeps its address as long as
// it lives, so renewals are rare.
const LeaseTime = 7 * 24 * time.Hour

// DHCPServer answers the DHCP requests the datapath hands over, on the VM's
// own host, with the VM's allocated address: nothing leaves the host.
type DHCPServer struct {
	DNS []netip.Addr
	// Local returns the VM behind a vif.
	Local func(ifindex int) (intent.LocalEndpoint, bool)
}

// Handle turns one frame from a vif into the reply frame to send back on the
// same vif, or nil when no reply is due.
func (s *DHCPServer) Handle(ifindex int, frame []byte) ([]byte, error) {
	vm, ok := s.Local(ifindex)
	if !ok {
		return nil, fmt.Errorf("dhcp from ifindex %d: no local VM there", ifindex)
	}
	payload, err := udpPayload(frame)
	if err != nil {
		return nil, fmt.Errorf("dhcp from %s: %w", vm.Name, err)
	}
	m, err := dhcp.Parse(payload)
	if err != nil {
		return nil, fmt.Errorf("dhcp from %s: %w", vm.Name, err)
	}
	vmMAC, err := net.ParseMAC(vm.MAC)
	if err != nil {
		return nil, err
	}
	if m.CHAddr.String() != vmMAC.String() {
		return nil, fmt.Errorf("dhcp from %s: asks for hardware address %s, not its own %s", vm.Name, m.CHAddr, vmMAC)
	}
	ip, err := netip.ParseAddr(vm.IP)
	if err != nil {
		return nil, err
	}
	plan := addrplan.Current()
	var mask [4]byte
	binary.BigEndian.PutUint32(mask[:], plan.SubnetMask())
	gw := plan.GatewayOf(ip)
	reply, _ := dhcp.Reply(m, dhcp.Lease{IP: ip, Mask: netip.AddrFrom4(mask), Gateway: gw, DNS: s.DNS, Time: LeaseTime})
	if reply == nil {
		return nil, nil
	}
	return udpFrame(ipam.VirtualMAC(gw), vmMAC, gw, netip.AddrFrom4([4]byte{255, 255, 255, 255}), 67, 68, reply), nil
}

func udpPayload(frame []byte) ([]byte, error) {
	if len(frame) < 14+20+8 || binary.BigEndian.Uint16(frame[12:]) != 0x0800 {
		return nil, errors.New("not an IPv4 frame")
	}
	ihl := int(frame[14]&0x0f) * 4
	if ihl < 20 || len(frame) < 14+ihl+8 || frame[14+9] != 17 {
		return nil, errors.New("not UDP")
	}
	udp := frame[14+ihl:]
	ulen := int(binary.BigEndian.Uint16(udp[4:]))
	if ulen < 8 || ulen > len(udp) {
		return nil, fmt.Errorf("UDP length %d does not fit the frame", ulen)
	}
	return udp[8:ulen], nil
}

// udpFrame builds Ethernet/IPv4/UDP around payload. The UDP checksum is left
// 0, which IPv4 allows; the IPv4 header checksum is computed.
func udpFrame(src, dst net.HardwareAddr, saddr, daddr netip.Addr, sport, dport uint16, payload []byte) []byte {
	f := make([]byte, 14+20+8+len(payload))
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	ip[8] = 64
	ip[9] = 17
	copy(ip[12:16], saddr.AsSlice())
	copy(ip[16:20], daddr.AsSlice())
	csum.SetIPv4(ip)
	udp := f[34:42]
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	copy(f[42:], payload)
	return f
}
