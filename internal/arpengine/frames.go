// Package arpengine is the agent's half of the ARP engine (paper §2, "The
// VNET ARP engine"): it finds the host of a remote VM the datapath has no
// mapping for, holds that VM's first packets meanwhile, keeps entries in use
// fresh (unicast to the last known host before multicast), forgets unused
// ones, and announces VMs that arrive on this host. The datapath answers the
// questions other hosts ask and learns the answers; this package only builds
// and reads frames and decides what to send when, so it needs no kernel.
package arpengine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/csum"
)

const (
	etherTypeARP  = 0x0806
	etherTypeIPv4 = 0x0800
	arpRequest    = 1
	arpReply      = 2
	arpFrameLen   = 14 + 28
)

// Broadcast is the Ethernet broadcast address.
var Broadcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// ScopeMAC is the Ethernet multicast address of ip's farm and subnet in
// the process's plan (addrplan.ScopeMAC: 03:00:0a:f:s:00 by default), as
// bpf/lib/broadcast.h builds it.
func ScopeMAC(ip netip.Addr) net.HardwareAddr {
	f, s, _ := addrplan.Current().IDs(ip)
	return addrplan.ScopeMAC(f, s)
}

// VirtualMAC is a VM's MAC: 02:00 and its IPv4 address (bpf/lib/route.h).
func VirtualMAC(ip netip.Addr) net.HardwareAddr {
	b := ip.As4()
	return net.HardwareAddr{0x02, 0x00, b[0], b[1], b[2], b[3]}
}

func arpFrame(ethDst, ethSrc net.HardwareAddr, op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr,
	tpa netip.Addr) []byte {
	f := make([]byte, arpFrameLen)
	copy(f[0:6], ethDst)
	copy(f[6:12], ethSrc)
	binary.BigEndian.PutUint16(f[12:14], etherTypeARP)
	a := f[14:]
	binary.BigEndian.PutUint16(a[0:2], 1) // Ethernet
	binary.BigEndian.PutUint16(a[2:4], etherTypeIPv4)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:8], op)
	copy(a[8:14], sha)
	if spa.Is4() {
		s := spa.As4()
		copy(a[14:18], s[:])
	}
	copy(a[18:24], tha)
	t := tpa.As4()
	copy(a[24:28], t[:])
	return f
}

// Request asks, from this host (hostMAC, hostIP), which host holds target.
// to is the last known host's MAC, or the target's ScopeMAC.
func Request(to, hostMAC net.HardwareAddr, hostIP, target netip.Addr) []byte {
	return arpFrame(to, hostMAC, arpRequest, hostMAC, hostIP, nil, target)
}

// Announcement tells every host that vm now lives behind hostMAC: a
// gratuitous ARP reply, which hosts use only to correct entries they hold.
func Announcement(hostMAC net.HardwareAddr, vm netip.Addr) []byte {
	return arpFrame(Broadcast, hostMAC, arpReply, VirtualMAC(vm), vm, Broadcast, vm)
}

// Gratuitous announces that addr (a floating address, not a VM's) is now
// reached at hostMAC: a broadcast request for addr from addr itself, which
// every neighbour that holds an entry for it updates, whatever its
// locktime (Linux's arp_process: a gratuitous request overrides).
func Gratuitous(hostMAC net.HardwareAddr, addr netip.Addr) []byte {
	return arpFrame(Broadcast, hostMAC, arpRequest, hostMAC, addr, nil, addr)
}

// Answer is what an ARP reply from another host says.
type Answer struct {
	VM      netip.Addr       // the address asked for
	HostMAC net.HardwareAddr // the host that holds it: the frame's source
}

// ParseAnswer reads an ARP reply frame.
func ParseAnswer(f []byte) (Answer, error) {
	if len(f) < arpFrameLen {
		return Answer{}, fmt.Errorf("ARP reply: %d bytes, want at least %d", len(f), arpFrameLen)
	}
	if binary.BigEndian.Uint16(f[12:14]) != etherTypeARP {
		return Answer{}, errors.New("ARP reply: not an ARP frame")
	}
	a := f[14:]
	if binary.BigEndian.Uint16(a[0:2]) != 1 || binary.BigEndian.Uint16(a[2:4]) != etherTypeIPv4 || a[4] != 6 || a[5] != 4 {
		return Answer{}, errors.New("ARP reply: not IPv4 over Ethernet")
	}
	if binary.BigEndian.Uint16(a[6:8]) != arpReply {
		return Answer{}, fmt.Errorf("ARP reply: operation %d", binary.BigEndian.Uint16(a[6:8]))
	}
	return Answer{VM: netip.AddrFrom4([4]byte(a[14:18])), HostMAC: net.HardwareAddr(append([]byte(nil), f[6:12]...))}, nil
}

// Destination is the IPv4 destination of a held Ethernet frame.
func Destination(f []byte) (netip.Addr, error) {
	if len(f) < 14+20 {
		return netip.Addr{}, fmt.Errorf("held frame: %d bytes is too short for IPv4", len(f))
	}
	if binary.BigEndian.Uint16(f[12:14]) != etherTypeIPv4 || f[14]>>4 != 4 {
		return netip.Addr{}, errors.New("held frame: not IPv4")
	}
	return netip.AddrFrom4([4]byte(f[30:34])), nil
}

// FinishChecksum completes the TCP or UDP checksum of an unfragmented IPv4
// frame. A VM's vif hands frames over with checksum offload pending (only
// the pseudo-header sum in the field); a frame sent again from a packet
// socket gets no offload, so its checksum must be whole. Other frames are
// left as they are.
func FinishChecksum(f []byte) {
	if len(f) < 14+20 || binary.BigEndian.Uint16(f[12:14]) != etherTypeIPv4 {
		return
	}
	ip := f[14:]
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	if ip[0]>>4 != 4 || ihl < 20 || total < ihl || total > len(ip) {
		return
	}
	if binary.BigEndian.Uint16(ip[6:8])&0x3fff != 0 { // a fragment, or more to come
		return
	}
	proto := ip[9]
	l4 := ip[ihl:total]
	var field int
	switch {
	case proto == 6 && len(l4) >= 20:
		field = 16
	case proto == 17 && len(l4) >= 8:
		field = 6
	default:
		return
	}
	l4[field], l4[field+1] = 0, 0
	binary.BigEndian.PutUint16(l4[field:], csum.Transport(ip[12:16], ip[16:20], proto, l4))
}
