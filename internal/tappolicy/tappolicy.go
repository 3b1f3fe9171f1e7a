// Package tappolicy reads, checks and resolves virtual TAP policies (paper
// 002, §III, Fig. 4): who the sender, receiver and monitor are, what the
// filters mean, and whether the monitor's farm may see the traffic. It is
// the one place the CLI, the REST API, the topology file and the policy
// compiler take these rules from. Pure: no kernel, no store.
//
// The rules, in one place:
//   - A name is 1-32 lowercase letters, digits or '-', starting with a letter.
//   - A sender or receiver REF is a VM (farm/subnet/vm, or the VM's IPv4 or
//     MAC as in the paper's Fig. 4), a whole subnet (farm/subnet) or any. An
//     IP or MAC is resolved to the VM holding it when the policy is written
//     and stored as farm/subnet/vm, so it follows the VM, not the address.
//   - The monitor is one VM, in any of the VM forms. Or, instead, a
//     collector: an IPv4 address on the fabric (in a host's uplink prefix,
//     not a host's own) that takes the copies encapsulated as erspan2 (the
//     default), erspan3 or gre. With a collector, any means any VM of the
//     other end's farm (both any is refused: which farm?).
//   - Filters, each optional: proto tcp|udp|icmp|N (0-255; 0 and any are
//     any), sport and dport N or N-M (1 <= N <= M <= 65535, only with proto
//     tcp, udp or any; with any they match TCP and UDP packets only), vlan
//     N = farm*256 + subnet, the segment of the packet's sender (onehop
//     networks are subnets, not VLANs).
//   - Tenancy: a monitor sees only its own farm's traffic. A sender or
//     receiver in another farm is refused unless the policy says cross-farm
//     and that farm and the monitor's peer with each other (both recorded
//     the peering). `any` means any VM of the monitor's farm, with or
//     without cross-farm: to watch a peer farm's VMs, name them.
//   - Both directions: the reverse rule swaps sender and receiver and sport
//     and dport (it catches the replies), and keeps proto. A vlan filter
//     narrows the sender, so in the reverse it narrows the receiver.
package tappolicy

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/filter"
	"github.com/onehop/onehop/internal/intent"
)

// FieldError names the input that is wrong: a CLI flag's or topology key's
// name (sender, sport) or a JSON body field (sportLo). The same type as the
// router's rules (filter.FieldError).
type FieldError = filter.FieldError

var fieldErr = filter.Errorf

// Any is the REF that matches every VM the policy may see.
const Any = "any"

var (
	nameRE   = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)
	farmRE   = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`) // farms and subnets (topology.nameRE)
	vmNameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,10}$`)  // topology.vmNameRE
)

// CheckName applies the naming rule of policies: the name is a key in the
// store, a label on metrics and a word on the command line.
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("tap name %q must be 1-32 lowercase letters, digits or '-', starting with a letter", name)
	}
	return nil
}

// Kinds of Ref.
const (
	KindVM     = "vm"     // farm/subnet/vm
	KindSubnet = "subnet" // farm/subnet
	KindAny    = "any"
	KindIP     = "ip"  // a VM's IPv4
	KindMAC    = "mac" // a VM's MAC
)

// Ref is a sender, receiver or monitor as written, read but not resolved.
type Ref struct {
	Kind               string
	Farm, Subnet, Name string // KindVM, KindSubnet
	IP                 netip.Addr
	MAC                string // KindMAC, lowercase aa:bb:cc:dd:ee:ff
}

// IsVM reports whether r names one VM (by name, IP or MAC).
func (r Ref) IsVM() bool { return r.Kind == KindVM || r.Kind == KindIP || r.Kind == KindMAC }

const refShape = "want farm/subnet/vm, farm/subnet, any, or a VM's IPv4 or MAC address"

// ParseRef reads a REF; it says nothing about whether what it names exists.
func ParseRef(s string) (Ref, error) {
	if s == Any {
		return Ref{Kind: KindAny}, nil
	}
	if s == "" {
		return Ref{}, fmt.Errorf("empty: %s", refShape)
	}
	if strings.Contains(s, "/") {
		parts := strings.Split(s, "/")
		if len(parts) > 3 {
			return Ref{}, fmt.Errorf("%q has %d parts: %s", s, len(parts), refShape)
		}
		if !farmRE.MatchString(parts[0]) {
			return Ref{}, fmt.Errorf("%q: farm name %q must be lowercase letters, digits and '-', starting with a letter", s, parts[0])
		}
		if !farmRE.MatchString(parts[1]) {
			return Ref{}, fmt.Errorf("%q: subnet name %q must be lowercase letters, digits and '-', starting with a letter", s, parts[1])
		}
		if len(parts) == 2 {
			return Ref{Kind: KindSubnet, Farm: parts[0], Subnet: parts[1]}, nil
		}
		if !vmNameRE.MatchString(parts[2]) {
			return Ref{}, fmt.Errorf("%q: vm name %q must be 1-11 lowercase letters or digits, starting with a letter", s, parts[2])
		}
		return Ref{Kind: KindVM, Farm: parts[0], Subnet: parts[1], Name: parts[2]}, nil
	}
	if ip, err := netip.ParseAddr(s); err == nil {
		if !ip.Is4() {
			return Ref{}, fmt.Errorf("%q is not an IPv4 address: VMs have IPv4 addresses (10.f.s.h)", s)
		}
		return Ref{Kind: KindIP, IP: ip}, nil
	}
	if mac, err := net.ParseMAC(s); err == nil {
		if len(mac) != 6 {
			return Ref{}, fmt.Errorf("%q is not a 6-byte Ethernet MAC address", s)
		}
		return Ref{Kind: KindMAC, MAC: mac.String()}, nil
	}
	return Ref{}, fmt.Errorf("%q: %s", s, refShape)
}

// Named is what a REF is stored as: farm/subnet/vm, farm/subnet or any.
func (r Ref) Named() string {
	switch r.Kind {
	case KindVM:
		return r.Farm + "/" + r.Subnet + "/" + r.Name
	case KindSubnet:
		return r.Farm + "/" + r.Subnet
	}
	return Any
}

// Protocol numbers the filters know by name.
const (
	ProtoICMP = 1
	ProtoTCP  = 6
	ProtoUDP  = 17
)

// ParseProto reads tcp, udp, icmp (any case), any, "" or a number 0-255;
// any, "" and 0 mean any protocol.
func ParseProto(s string) (uint8, error) {
	if p, err := filter.ProtoNumber(s); err == nil {
		return p, nil
	}
	n, err := strconv.ParseUint(s, 10, 8)
	if err != nil {
		return 0, fmt.Errorf("protocol %q: want tcp, udp, icmp, any or an IP protocol number 0-255", s)
	}
	return uint8(n), nil
}

// ProtoName is ParseProto's inverse: a name where there is one.
func ProtoName(p uint8) string {
	switch p {
	case 0:
		return Any
	case ProtoICMP:
		return "icmp"
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	}
	return strconv.Itoa(int(p))
}

// FormatPorts writes a port range as filter.ParsePorts reads it; "" for any.
func FormatPorts(lo, hi uint16) string {
	switch {
	case lo == 0:
		return ""
	case lo == hi:
		return strconv.Itoa(int(lo))
	}
	return fmt.Sprintf("%d-%d", lo, hi)
}

// Segment is the vlan number of subnet s of farm f: farm*2^subnet bits +
// subnet in the cloud's plan (farm*256 + subnet by default). A vlan filter
// is 16 bits, so a plan with more farm and subnet bits than that names only
// its lower segments.
func Segment(farm, subnet uint16) uint32 {
	return uint32(farm)<<addrplan.Current().SubnetBits | uint32(subnet)
}

// SegmentIDs splits a vlan number into farm and subnet ids.
func SegmentIDs(vlan uint16) (farm, subnet uint16) {
	b := addrplan.Current().SubnetBits
	return uint16(uint32(vlan) >> b), uint16(uint32(vlan) & (1<<b - 1))
}

// CheckFilter checks a filter as stored (intent.TapFilter); errors name
// the JSON field.
func CheckFilter(f intent.TapFilter) error {
	for _, p := range []struct {
		name   string
		lo, hi uint16
	}{{"sport", f.SportLo, f.SportHi}, {"dport", f.DportLo, f.DportHi}} {
		switch {
		case p.lo == 0 && p.hi != 0:
			return fieldErr(p.name+"Lo", "%sHi %d without %sLo: one port is %sLo = %sHi", p.name, p.hi, p.name, p.name, p.name)
		case p.lo != 0 && p.hi == 0:
			return fieldErr(p.name+"Hi", "%sLo %d without %sHi: one port is %sLo = %sHi", p.name, p.lo, p.name, p.name, p.name)
		case p.lo > p.hi:
			return fieldErr(p.name+"Hi", "%sHi %d is below %sLo %d: want %sLo <= %sHi", p.name, p.hi, p.name, p.lo, p.name, p.name)
		}
		if p.lo != 0 && f.Proto != 0 && f.Proto != ProtoTCP && f.Proto != ProtoUDP {
			return fieldErr(p.name+"Lo", "a %s filter needs proto tcp, udp or any, not %s: only TCP and UDP have ports", p.name, ProtoName(f.Proto))
		}
	}
	if f.VLAN != 0 {
		if fid, sid := SegmentIDs(f.VLAN); fid == 0 || sid == 0 {
			p := addrplan.Current()
			return fieldErr("vlan", "vlan %d is not a segment: a segment is farm*%d + subnet, both ids from 1 (farm 1 subnet 1 is %d)",
				f.VLAN, 1<<p.SubnetBits, Segment(1, 1))
		}
	}
	return nil
}

// Spec is a policy as an operator writes it on the command line or in a
// topology file: every value a string as typed.
type Spec struct {
	Name, Sender, Receiver, Monitor string
	Collector, Encap                string
	Proto, Sport, Dport             string
	VLAN                            string
	BothDirections, CrossFarm       bool
}

// ParseSpec reads and checks a Spec's syntax into the record the API
// takes; references stay as written (Resolve checks them against the VMs).
// Errors name the flag / key (sender, sport, vlan).
func ParseSpec(s Spec) (intent.TapPolicy, error) {
	p := intent.TapPolicy{Name: s.Name, Sender: s.Sender, Receiver: s.Receiver, Monitor: s.Monitor,
		Collector: s.Collector, Encap: s.Encap, BothDirections: s.BothDirections, CrossFarm: s.CrossFarm}
	if err := CheckName(s.Name); err != nil {
		return p, fieldErr("name", "%v", err)
	}
	if err := checkRefs(p); err != nil {
		return p, err
	}
	var err error
	if p.Proto, err = ParseProto(s.Proto); err != nil {
		return p, fieldErr("proto", "%v", err)
	}
	if p.SportLo, p.SportHi, err = filter.ParsePorts(s.Sport); err != nil {
		return p, fieldErr("sport", "%v", err)
	}
	if p.DportLo, p.DportHi, err = filter.ParsePorts(s.Dport); err != nil {
		return p, fieldErr("dport", "%v", err)
	}
	if s.VLAN != "" {
		n, err := strconv.ParseUint(s.VLAN, 10, 16)
		if err != nil || n == 0 {
			return p, fieldErr("vlan", "%q: want a segment number 1-65535 (farm*256 + subnet)", s.VLAN)
		}
		p.VLAN = uint16(n)
	}
	if err := CheckFilter(p.TapFilter); err != nil {
		fe := err.(*FieldError)
		// The flags are sport/dport, not the record's sportLo/Hi.
		fe.Field = strings.TrimSuffix(strings.TrimSuffix(fe.Field, "Lo"), "Hi")
		return p, fe
	}
	return p, nil
}

// Encapsulations of the copies to a collector.
const (
	EncapERSPAN2 = "erspan2" // GRE (0x88BE, sequenced) + ERSPAN type II: the default
	EncapERSPAN3 = "erspan3" // GRE (0x22EB, sequenced) + ERSPAN type III, with a timestamp
	EncapGRE     = "gre"     // plain GRE carrying the Ethernet frame (0x6558)
)

// Encaps are the encapsulations a collector may take, the default first.
var Encaps = []string{EncapERSPAN2, EncapERSPAN3, EncapGRE}

// CheckCollector checks a collector's syntax: an IPv4 unicast address
// and a known encapsulation ("" is the default). Whether the address is on
// the fabric is World.Resolve's to say.
func CheckCollector(addr, encap string) error {
	a, err := netip.ParseAddr(addr)
	if err != nil || !a.Is4() {
		return fieldErr("collector", "%q is not an IPv4 address: a collector is an address on the fabric", addr)
	}
	if !a.IsGlobalUnicast() && !a.IsPrivate() {
		return fieldErr("collector", "%s is not a unicast address: a collector is one machine on the fabric", addr)
	}
	if encap != "" && !slices.Contains(Encaps, encap) {
		return fieldErr("encap", "unknown encapsulation %q: want %s", encap, strings.Join(Encaps, ", "))
	}
	return nil
}

// checkRefs checks the three references' syntax, or the collector's.
func checkRefs(p intent.TapPolicy) error {
	switch {
	case p.Collector != "" && p.Monitor != "":
		return fieldErr("collector", "a policy has a monitor VM (%s) or a collector (%s), not both", p.Monitor, p.Collector)
	case p.Collector != "":
		if err := CheckCollector(p.Collector, p.Encap); err != nil {
			return err
		}
	case p.Encap != "":
		return fieldErr("encap", "encap %q without a collector: copies to a monitor VM are not encapsulated", p.Encap)
	case p.Monitor == "":
		return fieldErr("monitor", "no monitor and no collector: the copies go to a monitor VM or a collector on the fabric")
	}
	for _, r := range []struct{ field, ref string }{{"sender", p.Sender}, {"receiver", p.Receiver}, {"monitor", p.Monitor}} {
		if r.field == "monitor" && p.Collector != "" {
			continue
		}
		ref, err := ParseRef(r.ref)
		if err != nil {
			return fieldErr(r.field, "%v", err)
		}
		if r.field == "monitor" && !ref.IsVM() {
			return fieldErr("monitor", "%q is not one VM: the monitor is a VM (farm/subnet/vm, or its IPv4 or MAC), where the copies are delivered", r.ref)
		}
	}
	return nil
}

// Check checks a policy record's syntax: name, references, filter.
func Check(p intent.TapPolicy) error {
	if err := CheckName(p.Name); err != nil {
		return fieldErr("name", "%v", err)
	}
	if err := checkRefs(p); err != nil {
		return err
	}
	return CheckFilter(p.TapFilter)
}

// Peers reports whether farms a and b peer with each other: each listed
// the other (the same mutual consent traffic between them needs).
type Peers func(a, b string) bool

// CheckTenancy applies the tenancy rule to the farms of the sender and
// receiver ("" for any) and the monitor's farm; the error names the
// monitor field and says how to fix it.
func CheckTenancy(senderFarm, receiverFarm, monitorFarm string, crossFarm bool, peers Peers) error {
	for _, end := range []struct{ role, farm string }{{"sender", senderFarm}, {"receiver", receiverFarm}} {
		if end.farm == "" || end.farm == monitorFarm {
			continue
		}
		if !crossFarm {
			return fieldErr("monitor", "the monitor is in farm %s and the %s in farm %s: a monitor sees only its own farm's traffic unless the policy is cross-farm (--cross-farm) and the farms peer",
				monitorFarm, end.role, end.farm)
		}
		if !peers(end.farm, monitorFarm) {
			return fieldErr("monitor", "cross-farm: the monitor's farm %s and the %s's farm %s do not peer with each other (both must: onehop peer %s %s and onehop peer %s %s)",
				monitorFarm, end.role, end.farm, monitorFarm, end.farm, end.farm, monitorFarm)
		}
	}
	return nil
}

// CheckCollectorTenancy applies the tenancy rule to a policy whose copies
// go to a collector, given the farms of its sender and receiver ("" for
// any): with no monitor to take a farm from, one end must name a farm
// (any is any VM of the other end's farm), and ends in two farms need
// crossFarm and the farms' mutual peering. The error names the receiver.
func CheckCollectorTenancy(senderFarm, receiverFarm string, crossFarm bool, peers Peers) error {
	sf, rf := senderFarm, receiverFarm
	switch {
	case sf == "" && rf == "":
		return fieldErr("receiver", "sender and receiver are both any: with a collector, any is any VM of the other end's farm; name a VM or a subnet on one side")
	case sf == "" || rf == "" || sf == rf:
		return nil
	case !crossFarm:
		return fieldErr("receiver", "the sender is in farm %s and the receiver in farm %s: a policy spans two farms only if it is cross-farm (--cross-farm) and the farms peer", sf, rf)
	case !peers(sf, rf):
		return fieldErr("receiver", "cross-farm: farms %s and %s do not peer with each other (both must: onehop peer %s %s and onehop peer %s %s)", sf, rf, sf, rf, rf, sf)
	}
	return nil
}
