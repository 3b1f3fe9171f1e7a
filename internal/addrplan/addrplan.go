// Package addrplan is the cloud's address plan: the tenant prefix and how
// its host bits split between farm, subnet and VM (Diverter §2: 10.f.s.h by
// default, a split "changed by the infrastructure owner at set-up time").
// It is pure: composing and decomposing addresses, each subnet's gateway
// and broadcast, and the scope multicast MACs, for every daemon and for the
// datapath's load-time constants (bpf/lib/route.h).
package addrplan

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
)

// Limits on a split. Farm and subnet ids are 16-bit in every key (intent,
// the datapath's vis_key and scope_key, the scope MAC); a subnet needs its
// network, gateway and broadcast addresses besides at least one VM.
const (
	MaxFarmBits   = 16
	MaxSubnetBits = 16
	MinVMBits     = 2
)

// GatewayHost is the host part every subnet keeps for its virtual gateway.
const GatewayHost = 1

// Plan is an address plan. The zero value is not valid; Default is today's
// 10.f.s.h.
type Plan struct {
	Prefix     netip.Prefix `json:"prefix"`
	FarmBits   int          `json:"farmBits"`
	SubnetBits int          `json:"subnetBits"`
	VMBits     int          `json:"vmBits"`
}

// Default is 10.0.0.0/8 split 8/8/8: 10.f.s.h, 255 farms of 255 subnets of
// 253 VMs.
func Default() Plan {
	return Plan{Prefix: netip.MustParsePrefix("10.0.0.0/8"), FarmBits: 8, SubnetBits: 8, VMBits: 8}
}

// ErrInvalid is wrapped by every error of a plan that cannot be used.
var ErrInvalid = errors.New("invalid address plan")

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

// Parse reads "PREFIX:F/S/V" (e.g. "10.0.0.0/8:12/6/6"), or "F/S/V" on
// the default prefix, and validates it.
func Parse(s string) (Plan, error) {
	s = strings.TrimSpace(s)
	prefix, split := "10.0.0.0/8", s
	if i := strings.LastIndex(s, ":"); i >= 0 {
		prefix, split = s[:i], s[i+1:]
	}
	var p Plan
	pfx, err := netip.ParsePrefix(prefix)
	if err != nil {
		return Plan{}, invalid("prefix %q is not an IPv4 prefix like 10.0.0.0/8", prefix)
	}
	p.Prefix = pfx
	parts := strings.Split(split, "/")
	if len(parts) != 3 {
		return Plan{}, invalid("split %q is not farm/subnet/vm bits like 8/8/8", split)
	}
	for i, dst := range []*int{&p.FarmBits, &p.SubnetBits, &p.VMBits} {
		n, err := strconv.Atoi(parts[i])
		if err != nil || n < 0 || n > 32 {
			return Plan{}, invalid("%s bits %q in %q is not a number from 0 to 32", []string{"farm", "subnet", "vm"}[i], parts[i], split)
		}
		*dst = n
	}
	return p, p.Validate()
}

// MustParse is Parse for constants: it panics on an invalid plan.
func MustParse(s string) Plan {
	p, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return p
}

// Validate says what is wrong with p, or nil.
func (p Plan) Validate() error {
	if !p.Prefix.IsValid() || !p.Prefix.Addr().Is4() {
		return invalid("prefix %v is not an IPv4 prefix", p.Prefix)
	}
	if p.Prefix.Bits() < 1 {
		return invalid("prefix %v is the whole address space: the tenant space needs a prefix of at least one bit", p.Prefix)
	}
	if p.Prefix.Masked() != p.Prefix {
		return invalid("prefix %v has bits set past its length (the network is %v)", p.Prefix, p.Prefix.Masked())
	}
	if p.FarmBits < 1 || p.FarmBits > MaxFarmBits {
		return invalid("farm bits %d: want 1 to %d", p.FarmBits, MaxFarmBits)
	}
	if p.SubnetBits < 1 || p.SubnetBits > MaxSubnetBits {
		return invalid("subnet bits %d: want 1 to %d", p.SubnetBits, MaxSubnetBits)
	}
	if p.VMBits < MinVMBits {
		return invalid("vm bits %d: want at least %d (a subnet keeps its network, gateway and broadcast addresses)", p.VMBits, MinVMBits)
	}
	if host := 32 - p.Prefix.Bits(); p.FarmBits+p.SubnetBits+p.VMBits != host {
		return invalid("split %d/%d/%d has %d bits but prefix %v leaves %d", p.FarmBits, p.SubnetBits, p.VMBits,
			p.FarmBits+p.SubnetBits+p.VMBits, p.Prefix, host)
	}
	return nil
}

// String is the form Parse reads: "10.0.0.0/8:8/8/8".
func (p Plan) String() string {
	return fmt.Sprintf("%v:%d/%d/%d", p.Prefix, p.FarmBits, p.SubnetBits, p.VMBits)
}

// IsDefault reports whether p is Default.
func (p Plan) IsDefault() bool { return p == Default() }

// MaxFarms is how many farms p holds: ids 1 .. 2^farm bits - 1 (0 names no
// farm: a TAP key's "any farm" and an unset id).
func (p Plan) MaxFarms() int { return 1<<p.FarmBits - 1 }

// MaxSubnets is how many subnets a farm holds: ids 1 .. 2^subnet bits - 1
// (subnet 0 is the farm-wide broadcast scope).
func (p Plan) MaxSubnets() int { return 1<<p.SubnetBits - 1 }

// MaxVMs is how many VMs a subnet holds: host ids 2 .. 2^vm bits - 2.
func (p Plan) MaxVMs() int { return 1<<p.VMBits - 3 }

// MaxHost is the highest host id a VM may take (one below the broadcast).
func (p Plan) MaxHost() uint32 { return 1<<p.VMBits - 2 }

func u32(a netip.Addr) uint32 { b := a.As4(); return binary.BigEndian.Uint32(b[:]) }

func addr(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// Address composes farm, subnet and host into an address. Ids past their
// field are cut to it; callers allocate within MaxFarms and the rest.
func (p Plan) Address(farm, subnet uint16, host uint32) netip.Addr {
	return addr(u32(p.Prefix.Addr()) | p.ids(farm, subnet, host))
}

// Key is Address without the prefix: the farm, subnet and host bits alone,
// as the datapath's TAP index keys a subnet (host 0) or a farm (subnet and
// host 0): 0.f.s.0 and 0.f.0.0 by default.
func (p Plan) Key(farm, subnet uint16, host uint32) netip.Addr {
	return addr(p.ids(farm, subnet, host))
}

func (p Plan) ids(farm, subnet uint16, host uint32) uint32 {
	return (uint32(farm)&mask(p.FarmBits))<<(p.SubnetBits+p.VMBits) |
		(uint32(subnet)&mask(p.SubnetBits))<<p.VMBits | host&mask(p.VMBits)
}

// IDs decomposes an address or a Key, whatever its prefix bits.
func (p Plan) IDs(a netip.Addr) (farm, subnet uint16, host uint32) {
	v := u32(a)
	return uint16(v >> (p.SubnetBits + p.VMBits) & mask(p.FarmBits)), uint16(v >> p.VMBits & mask(p.SubnetBits)),
		v & mask(p.VMBits)
}

func mask(bits int) uint32 { return uint32(1)<<bits - 1 }

// Split decomposes a tenant address; false when ip is outside the prefix.
func (p Plan) Split(ip netip.Addr) (farm, subnet uint16, host uint32, ok bool) {
	if !ip.Is4() || !p.Prefix.Contains(ip) {
		return 0, 0, 0, false
	}
	farm, subnet, host = p.IDs(ip)
	return farm, subnet, host, true
}

// Contains reports whether ip is in the tenant space.
func (p Plan) Contains(ip netip.Addr) bool { return ip.Is4() && p.Prefix.Contains(ip) }

// FarmOf is the farm id of a tenant address, false outside the prefix.
func (p Plan) FarmOf(ip netip.Addr) (uint16, bool) {
	f, _, _, ok := p.Split(ip)
	return f, ok
}

// SubnetPrefix is the prefix of farm/subnet.
func (p Plan) SubnetPrefix(farm, subnet uint16) netip.Prefix {
	return netip.PrefixFrom(p.Address(farm, subnet, 0), 32-p.VMBits)
}

// FarmPrefix is the prefix of a farm: 10.f.0.0/16 by default.
func (p Plan) FarmPrefix(farm uint16) netip.Prefix {
	return netip.PrefixFrom(p.Address(farm, 0, 0), 32-p.SubnetBits-p.VMBits)
}

// SubnetBitsLen is the prefix length of every subnet (24 by default).
func (p Plan) SubnetBitsLen() int { return 32 - p.VMBits }

// Gateway is farm/subnet's virtual gateway: host 1.
func (p Plan) Gateway(farm, subnet uint16) netip.Addr { return p.Address(farm, subnet, GatewayHost) }

// GatewayOf is the gateway of the subnet ip is in.
func (p Plan) GatewayOf(ip netip.Addr) netip.Addr {
	f, s, _, _ := p.Split(ip)
	return p.Gateway(f, s)
}

// Broadcast is farm/subnet's broadcast address: every host bit set.
func (p Plan) Broadcast(farm, subnet uint16) netip.Addr {
	return p.Address(farm, subnet, mask(p.VMBits))
}

// SubnetMask is the mask of one subnet (prefix, farm and subnet bits), in
// host order: 0xffffff00 by default. The datapath's same_subnet uses it.
func (p Plan) SubnetMask() uint32 { return ^mask(p.VMBits) }

// ScopeMAC is the fabric's Ethernet multicast address of a broadcast scope
// (subnet 0: the whole farm). 03:FH:0a:FL:SL:SH, the farm's and subnet's
// high bytes outside the bytes the 8/8/8 plan has always used, so the
// default's addresses stay 03:00:0a:f:s:00. bpf/lib/broadcast.h builds the
// same.
func ScopeMAC(farm, subnet uint16) net.HardwareAddr {
	return net.HardwareAddr{0x03, byte(farm >> 8), 0x0a, byte(farm), byte(subnet), byte(subnet >> 8)}
}

// ParseScopeMAC is the scope a ScopeMAC names; false for any other MAC.
func ParseScopeMAC(m net.HardwareAddr) (farm, subnet uint16, ok bool) {
	if len(m) != 6 || m[0] != 0x03 || m[2] != 0x0a {
		return 0, 0, false
	}
	return uint16(m[1])<<8 | uint16(m[3]), uint16(m[5])<<8 | uint16(m[4]), true
}

var current atomic.Pointer[Plan]

// Current is the plan this process runs under: the cloud's, read from the
// store when the daemon starts (Set), Default until then. A plan is fixed
// when the cloud is created, so it is a process-wide fact like a constant,
// not a value threaded through every address helper.
func Current() Plan {
	if p := current.Load(); p != nil {
		return *p
	}
	return Default()
}

// Set makes p the process's plan. It refuses an invalid plan.
func Set(p Plan) error {
	if err := p.Validate(); err != nil {
		return err
	}
	current.Store(&p)
	return nil
}
