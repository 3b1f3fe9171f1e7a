package datapath

import (
	"errors"
	"fmt"
)

// VifKind is what a guest's vif is (enum vif_kind in bpf/lib/common.h): it
// decides how the datapath delivers a frame to the guest (deliver_to_vif in
// bpf/lib/redirect.h).
type VifKind = vifVifKind

// The kinds of link a guest can be on.
const (
	// VifVeth is the host end of a veth pair (the lab's VMs, containers):
	// frames go straight into its peer (bpf_redirect_peer).
	VifVeth = vifVifKindVIF_VETH
	// VifTap is a tap device (QEMU, libvirt; with or without vnet_hdr):
	// frames go out of the device (bpf_redirect), to the process reading it.
	VifTap = vifVifKindVIF_TAP
	// VifMacvtap is a macvtap (libvirt <interface type='direct'>): what the
	// guest writes leaves by the device's egress, where the vif program
	// sits; frames go into its ingress, marked with GuestMark, past a guard
	// that drops whatever its lower device hands the guest on its own.
	VifMacvtap = vifVifKindVIF_MACVTAP
)

// GuestMark is the skb mark of a frame handed to a macvtap guest (enum
// guest_mark in bpf/lib/common.h): the datapath sets it when it delivers,
// the agent's packet socket sets it (SO_MARK) on what it sends a guest, and
// the guard on a macvtap's ingress passes nothing else.
const GuestMark = uint32(vifGuestMarkGUEST_MARK)

// vifKindNames are the kinds' names in status, `onehop stats` and logs:
// the netlink kind of the link (IFLA_INFO_KIND, "tap" for a tun device in
// tap mode).
var vifKindNames = map[VifKind]string{VifVeth: "veth", VifTap: "tap", VifMacvtap: "macvtap"}

// VifKindName is kind's name ("veth", "tap", "macvtap").
func VifKindName(kind VifKind) string {
	if n, ok := vifKindNames[kind]; ok {
		return n
	}
	return fmt.Sprintf("kind %d", kind)
}

// ErrNotGuestLink is the error of a link no guest can be on here: the
// agent leaves it unattached and reports it refused, with the reason.
var ErrNotGuestLink = errors.New("not a kind of link onehop delivers to")

// VifKindOf is the vif kind of a link of netlink kind linkKind ("veth",
// "tap", "tun", "macvtap", ...): an error wrapping ErrNotGuestLink says why
// any other is refused.
func VifKindOf(linkKind string) (VifKind, error) {
	switch linkKind {
	case "veth":
		return VifVeth, nil
	case "tap":
		return VifTap, nil
	case "tun":
		return 0, fmt.Errorf("a tun device carries IP packets, not Ethernet frames (open it with IFF_TAP): %w", ErrNotGuestLink)
	case "macvtap":
		return VifMacvtap, nil
	case "macvlan":
		return 0, fmt.Errorf("a macvlan carries no guest of its own (a macvtap does: its fd is the guest's NIC): %w", ErrNotGuestLink)
	}
	return 0, fmt.Errorf("a %s link is no guest's interface (a veth, a tap or a macvtap is): %w", linkKind, ErrNotGuestLink)
}

// Vif is a guest's vif as found on the host.
type Vif struct {
	Ifindex int
	Kind    VifKind
}
