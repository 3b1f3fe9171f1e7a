// Package ipam turns farm, subnet and VM names into addresses of the cloud's
// plan (internal/addrplan; the paper's 10.f.s.h by default, Diverter §2) and
// the virtual MACs derived from them. It is pure: it keeps previous
// allocations stable and hands out the lowest free ids.
package ipam

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"

	"github.com/onehop/onehop/internal/addrplan"
)

// GatewayHostID is the host part reserved in every subnet for the notional
// virtual gateway, 10.f.s.1.
const GatewayHostID = addrplan.GatewayHost

// First ids a farm, subnet or VM can take; the last ones are the plan's
// (addrplan.Current). Host 0 is the network, the last the broadcast of the
// subnet, and 1 is the gateway, so VMs start at 2.
const (
	minFarmID   = 1
	minSubnetID = 1
	minVMID     = 2
)

// Address returns farm/subnet/host in the process's plan: 10.f.s.h by default.
func Address(farm, subnet uint16, host uint32) netip.Addr {
	return addrplan.Current().Address(farm, subnet, host)
}

// SubnetPrefix returns the subnet's prefix (10.f.s.0/24 by default).
func SubnetPrefix(farm, subnet uint16) netip.Prefix {
	return addrplan.Current().SubnetPrefix(farm, subnet)
}

// Gateway returns host 1 of the subnet (10.f.s.1), its virtual gateway.
func Gateway(farm, subnet uint16) netip.Addr {
	return Address(farm, subnet, GatewayHostID)
}

// VirtualMAC is 02:00 followed by the four address bytes: locally
// administered, unicast, and computable from the address alone, so a host
// receiving a packet can restore its sender's MAC without asking anyone. The
// datapath (bpf/lib/route.h) derives it the same way.
func VirtualMAC(ip netip.Addr) net.HardwareAddr {
	b := ip.As4()
	return net.HardwareAddr{0x02, 0x00, b[0], b[1], b[2], b[3]}
}

// ErrExhausted is wrapped by every error of an id range that is full: the
// plan's farms, a farm's subnets, or a subnet's VMs (255, 255 and 253 in
// the default plan). Its message says
// how many ids the range has and that none is left.
var ErrExhausted = errors.New("no free id left")

// Allocations records which id each farm, subnet (farm/subnet) and VM
// (farm/subnet/vm) holds. The zero value is empty and ready to use.
type Allocations struct {
	Farms   map[string]uint16 `json:"farms"`
	Subnets map[string]uint16 `json:"subnets"`
	VMs     map[string]uint32 `json:"vms"`
}

func (a *Allocations) init() {
	if a.Farms == nil {
		a.Farms = map[string]uint16{}
	}
	if a.Subnets == nil {
		a.Subnets = map[string]uint16{}
	}
	if a.VMs == nil {
		a.VMs = map[string]uint32{}
	}
}

// Farm returns the id of farm name, allocating the lowest free one.
func (a *Allocations) Farm(name string) (uint16, error) {
	a.init()
	if id, ok := a.Farms[name]; ok {
		return id, nil
	}
	maxFarmID := addrplan.Current().MaxFarms()
	id, err := lowestFree(a.Farms, func(string) bool { return true }, minFarmID, maxFarmID)
	if err != nil {
		return 0, fmt.Errorf("farm %q: %w", name, exhausted("for a farm", minFarmID, maxFarmID))
	}
	a.Farms[name] = uint16(id)
	return uint16(id), nil
}

// Subnet returns the id of farm/subnet, allocating the farm if needed.
func (a *Allocations) Subnet(farm, subnet string) (uint16, error) {
	if _, err := a.Farm(farm); err != nil {
		return 0, err
	}
	key := farm + "/" + subnet
	if id, ok := a.Subnets[key]; ok {
		return id, nil
	}
	maxSubnetID := addrplan.Current().MaxSubnets()
	id, err := lowestFree(a.Subnets, hasPrefix(farm+"/"), minSubnetID, maxSubnetID)
	if err != nil {
		return 0, fmt.Errorf("subnet %q: %w", key, exhausted("for a subnet in farm "+farm, minSubnetID, maxSubnetID))
	}
	a.Subnets[key] = uint16(id)
	return uint16(id), nil
}

// VM returns the address of farm/subnet/vm, allocating what is missing.
func (a *Allocations) VM(farm, subnet, vm string) (netip.Addr, error) {
	return a.VMExcept(farm, subnet, vm, nil)
}

// VMExcept is VM, but a new address is never one of held: addresses that
// are not allocated to any VM yet still in use elsewhere (a VNAT endpoint's
// connections still use its old address virtually, paper §3.4.2). A VM that
// already has an address keeps it, held or not. A held address counts as
// taken when the subnet's ids run out.
func (a *Allocations) VMExcept(farm, subnet, vm string, held map[netip.Addr]bool) (netip.Addr, error) {
	fid, err := a.Farm(farm)
	if err != nil {
		return netip.Addr{}, err
	}
	sid, err := a.Subnet(farm, subnet)
	if err != nil {
		return netip.Addr{}, err
	}
	prefix := farm + "/" + subnet + "/"
	key := prefix + vm
	id, ok := a.VMs[key]
	if !ok {
		used := a.VMs
		if len(held) > 0 {
			used = make(map[string]uint32, len(a.VMs)+len(held))
			for k, v := range a.VMs {
				used[k] = v
			}
			for addr := range held {
				if f, s, h, ok := addrplan.Current().Split(addr); ok && f == fid && s == sid {
					used[prefix+"\x00held "+addr.String()] = h
				}
			}
		}
		maxVMID := int(addrplan.Current().MaxHost())
		vid, err := lowestFree(used, hasPrefix(prefix), minVMID, maxVMID)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("vm %q: %w", key, exhausted("for a VM in subnet "+farm+"/"+subnet, minVMID, maxVMID))
		}
		id = uint32(vid)
		a.VMs[key] = id
	}
	return Address(fid, sid, id), nil
}

func hasPrefix(p string) func(string) bool {
	return func(k string) bool { return len(k) > len(p) && k[:len(p)] == p }
}

func lowestFree[T uint16 | uint32](used map[string]T, inScope func(string) bool, lo, hi int) (int, error) {
	taken := make([]int, 0, len(used))
	for k, id := range used {
		if inScope(k) {
			taken = append(taken, int(id))
		}
	}
	sort.Ints(taken)
	next := lo
	for _, id := range taken {
		if id == next {
			next++
		} else if id > next {
			break
		}
	}
	if next > hi {
		return 0, ErrExhausted
	}
	return next, nil
}

func exhausted(what string, lo, hi int) error {
	return fmt.Errorf("%w %s: all %d of %d..%d are in use, 0 left", ErrExhausted, what, hi-lo+1, lo, hi)
}
