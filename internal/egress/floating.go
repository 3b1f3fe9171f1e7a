package egress

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// Floating addresses (bpf/lib/floating.h, docs/north-south.md): a VM's
// floating address is one more egress_addrs entry, EGRESS_ADDR_FLOATING
// naming the VM's slot, on the host the VM lives on. The datapath steers
// it whole to the VM and answers ARP for it; the feature announces it (a
// gratuitous ARP) when it arrives, so the fabric's neighbours move to this
// host at once after a live move.

// WithAnnounce gives the feature what sends a gratuitous ARP for a
// floating address from this host (the agent's uplink socket). Without
// it, the fabric learns the address's new host on its next ARP question.
func (f *Feature) WithAnnounce(send func(netip.Addr)) *Feature {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.announce = send
	return f
}

// putFloating writes v's floating address, after its slot holds it (the
// datapath checks the slot names the address back), and announces it.
func (f *Feature) putFloating(addrs *ebpf.Map, v VM, slot uint32) error {
	if !v.Floating.IsValid() {
		return nil
	}
	if err := addrs.Put(be32(v.Floating), addrRecord{Kind: addrFloating, Uplink: 0, Slot: slot}); err != nil {
		return fmt.Errorf("egress: vm %s floating address %s: %w", v.Name, v.Floating, err)
	}
	if f.announce != nil {
		f.announce(v.Floating)
	}
	return nil
}

// clearFloating forgets v's floating address: this host stops steering it
// and stops answering ARP for it.
func clearFloating(addrs *ebpf.Map, v VM) error {
	if !v.Floating.IsValid() {
		return nil
	}
	if err := addrs.Delete(be32(v.Floating)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("egress: forget vm %s floating address %s: %w", v.Name, v.Floating, err)
	}
	return nil
}
