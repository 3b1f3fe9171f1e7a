package tappolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/intent"
)

// World is the intent a policy is resolved against.
type World struct {
	farms   map[string]intent.Farm
	subnets map[string]intent.Subnet // farm/subnet
	bySeg   map[uint32]intent.Subnet
	vms     map[string]intent.VM // farm/subnet/vm
	byIP    map[netip.Addr]intent.VM
	byMAC   map[string]intent.VM
	// fabric are the hosts' uplink prefixes and their own addresses: where
	// a collector may be (WithFabric).
	fabric []netip.Prefix
	hosts  map[netip.Addr]string
}

// WithFabric gives the world the hosts' node records: a collector must be
// an address in one of their uplinks' prefixes, and no host's own.
func (w *World) WithFabric(nodes []intent.Node) *World {
	w.hosts = map[netip.Addr]string{}
	for _, n := range nodes {
		ups := n.Uplinks
		if len(ups) == 0 && n.UplinkIP != "" {
			ups = []intent.NodeUplink{{IP: n.UplinkIP, Bits: 32}}
		}
		for _, u := range ups {
			a, err := netip.ParseAddr(u.IP)
			if err != nil || !a.Is4() {
				continue
			}
			w.hosts[a] = n.Name
			if u.Bits == 0 {
				continue // not reported: an agent that predates it
			}
			if p, err := a.Prefix(u.Bits); err == nil {
				w.fabric = append(w.fabric, p)
			}
		}
	}
	return w
}

// checkFabric reports why addr cannot be a collector: not in any host's
// uplink prefix, or a host's own address. Without WithFabric it is not
// checked (the policy compiler: the controller checked it when written).
func (w *World) checkFabric(addr string) error {
	if w.hosts == nil {
		return nil
	}
	a, _ := netip.ParseAddr(addr)
	if h, ok := w.hosts[a]; ok {
		return fieldErr("collector", "%s is host %s's own address: a collector is another machine on the fabric", addr, h)
	}
	for _, p := range w.fabric {
		if p.Contains(a) {
			return nil
		}
	}
	if len(w.fabric) == 0 {
		return fieldErr("collector", "%s: no host has reported its uplink's prefix yet, so the fabric is not known; try again once the agents run", addr)
	}
	seen := map[netip.Prefix]bool{}
	var ps []string
	for _, p := range w.fabric {
		if !seen[p.Masked()] {
			seen[p.Masked()] = true
			ps = append(ps, p.Masked().String())
		}
	}
	return fieldErr("collector", "%s is not on the fabric (%s): the hosts send copies out of their uplinks, to a neighbour on the same link", addr, strings.Join(ps, ", "))
}

// NewWorld indexes farms, subnets and VMs.
func NewWorld(farms []intent.Farm, subnets []intent.Subnet, vms []intent.VM) *World {
	w := &World{farms: map[string]intent.Farm{}, subnets: map[string]intent.Subnet{}, bySeg: map[uint32]intent.Subnet{},
		vms: map[string]intent.VM{}, byIP: map[netip.Addr]intent.VM{}, byMAC: map[string]intent.VM{}}
	for _, f := range farms {
		w.farms[f.Name] = f
	}
	for _, s := range subnets {
		w.subnets[s.Farm+"/"+s.Name] = s
		if f, ok := w.farms[s.Farm]; ok {
			w.bySeg[Segment(f.ID, s.ID)] = s
		}
	}
	for _, v := range vms {
		w.vms[v.FullName()] = v
		if ip, err := netip.ParseAddr(v.IP); err == nil {
			w.byIP[ip] = v
		}
		if r, err := ParseRef(v.MAC); err == nil && r.Kind == KindMAC {
			w.byMAC[r.MAC] = v
		}
	}
	return w
}

// Peers is the mutual peering of two farms as their records say.
func (w *World) Peers(a, b string) bool {
	return slices.Contains(w.farms[a].Peers, b) && slices.Contains(w.farms[b].Peers, a)
}

// resolved is one end of a policy found in the world.
type resolved struct {
	ref    Ref
	vm     intent.VM     // KindVM
	subnet intent.Subnet // KindSubnet, and the VM's subnet for KindVM
}

func (r resolved) farm() string {
	if r.ref.Kind == KindAny {
		return ""
	}
	return r.ref.Farm
}

// resolve finds what ref names; an IP or MAC becomes the VM's name.
func (w *World) resolve(field, s string) (resolved, error) {
	ref, err := ParseRef(s)
	if err != nil {
		return resolved{}, fieldErr(field, "%v", err)
	}
	var vm intent.VM
	var ok bool
	switch ref.Kind {
	case KindAny:
		return resolved{ref: ref}, nil
	case KindSubnet:
		sub, ok := w.subnets[ref.Named()]
		if !ok {
			return resolved{}, fieldErr(field, "no subnet %s", ref.Named())
		}
		return resolved{ref: ref, subnet: sub}, nil
	case KindVM:
		if vm, ok = w.vms[ref.Named()]; !ok {
			return resolved{}, fieldErr(field, "no vm %s", ref.Named())
		}
	case KindIP:
		if vm, ok = w.byIP[ref.IP]; !ok {
			return resolved{}, fieldErr(field, "no VM has address %s", ref.IP)
		}
	case KindMAC:
		if vm, ok = w.byMAC[ref.MAC]; !ok {
			return resolved{}, fieldErr(field, "no VM has MAC %s", ref.MAC)
		}
	}
	ref = Ref{Kind: KindVM, Farm: vm.Farm, Subnet: vm.Subnet, Name: vm.Name}
	return resolved{ref: ref, vm: vm, subnet: w.subnets[vm.Farm+"/"+vm.Subnet]}, nil
}

// Resolve checks a policy against the world and returns it as it is
// stored: sender, receiver and monitor as farm/subnet/vm, farm/subnet or
// any. Errors name the field (sender, receiver, monitor, vlan, ...).
func (w *World) Resolve(p intent.TapPolicy) (intent.TapPolicy, error) {
	if err := Check(p); err != nil {
		return p, err
	}
	e, err := w.ends(p)
	if err != nil {
		return p, err
	}
	p.Sender, p.Receiver = e.snd.ref.Named(), e.rcv.ref.Named()
	if p.Collector == "" {
		p.Monitor = e.mon.ref.Named()
	} else if p.Encap == "" {
		p.Encap = EncapERSPAN2
	}
	return p, nil
}

// endsOf is a policy's three ends, resolved and checked against each other.
type endsOf struct {
	snd, rcv, mon resolved
	// sndEnd is the sender as the datapath matches it: narrowed to the
	// vlan's subnet when there is a vlan filter.
	sndEnd, rcvEnd intent.TapEnd
}

func (w *World) ends(p intent.TapPolicy) (endsOf, error) {
	var e endsOf
	var err error
	if e.snd, err = w.resolve("sender", p.Sender); err != nil {
		return e, err
	}
	if e.rcv, err = w.resolve("receiver", p.Receiver); err != nil {
		return e, err
	}
	if p.Collector != "" {
		return e, w.collectorEnds(p, &e)
	}
	if e.mon, err = w.resolve("monitor", p.Monitor); err != nil {
		return e, err
	}
	if e.mon.ref.Kind != KindVM {
		return e, fieldErr("monitor", "%q is not one VM: the monitor is a VM, where the copies are delivered", p.Monitor)
	}
	if e.snd.ref.Kind == KindVM && e.rcv.ref.Kind == KindVM && e.snd.vm.FullName() == e.rcv.vm.FullName() {
		return e, fieldErr("receiver", "%s is also the sender: a VM's traffic to itself never leaves it", e.rcv.vm.FullName())
	}
	for _, end := range []struct {
		role string
		r    resolved
	}{{"sender", e.snd}, {"receiver", e.rcv}} {
		if end.r.ref.Kind == KindVM && end.r.vm.FullName() == e.mon.vm.FullName() {
			return e, fieldErr("monitor", "%s is the policy's %s: it already has that traffic; pick another VM to monitor it", e.mon.vm.FullName(), end.role)
		}
	}
	monFarm := e.mon.vm.Farm
	if err := CheckTenancy(e.snd.farm(), e.rcv.farm(), monFarm, p.CrossFarm, w.Peers); err != nil {
		return e, err
	}
	mf, ok := w.farms[monFarm]
	if !ok {
		return e, fieldErr("monitor", "the monitor's farm %s has no record", monFarm)
	}
	if e.sndEnd, err = w.tapEnd(e.snd, mf.ID); err != nil {
		return e, fieldErr("sender", "%v", err)
	}
	if e.rcvEnd, err = w.tapEnd(e.rcv, mf.ID); err != nil {
		return e, fieldErr("receiver", "%v", err)
	}
	if p.VLAN != 0 {
		if e.sndEnd, err = w.narrow(e.sndEnd, p.VLAN, p.Sender, monFarm, mf.ID); err != nil {
			return e, err
		}
	}
	return e, nil
}

// collectorEnds checks a policy whose copies go to a collector: the
// collector on the fabric, and the ends' farms. With no monitor to take
// its farm from, any is any VM of the other end's farm; ends in two farms
// need --cross-farm and the farms' mutual peering, as with a monitor.
func (w *World) collectorEnds(p intent.TapPolicy, e *endsOf) error {
	if err := CheckCollector(p.Collector, p.Encap); err != nil {
		return err
	}
	if err := w.checkFabric(p.Collector); err != nil {
		return err
	}
	if e.snd.ref.Kind == KindVM && e.rcv.ref.Kind == KindVM && e.snd.vm.FullName() == e.rcv.vm.FullName() {
		return fieldErr("receiver", "%s is also the sender: a VM's traffic to itself never leaves it", e.rcv.vm.FullName())
	}
	if err := CheckCollectorTenancy(e.snd.farm(), e.rcv.farm(), p.CrossFarm, w.Peers); err != nil {
		return err
	}
	farm := e.snd.farm()
	if farm == "" {
		farm = e.rcv.farm()
	}
	f, ok := w.farms[farm]
	if !ok {
		return fieldErr("sender", "farm %s has no record", farm)
	}
	var err error
	if e.sndEnd, err = w.tapEnd(e.snd, f.ID); err != nil {
		return fieldErr("sender", "%v", err)
	}
	if e.rcvEnd, err = w.tapEnd(e.rcv, f.ID); err != nil {
		return fieldErr("receiver", "%v", err)
	}
	if p.VLAN != 0 {
		if e.sndEnd, err = w.narrow(e.sndEnd, p.VLAN, p.Sender, farm, f.ID); err != nil {
			return err
		}
	}
	return nil
}

// tapEnd is an end as the datapath matches it. `any` is any VM of the
// monitor's farm (id monFarm).
func (w *World) tapEnd(r resolved, monFarm uint16) (intent.TapEnd, error) {
	switch r.ref.Kind {
	case KindAny:
		return intent.TapEnd{Kind: KindAny, Farm: monFarm}, nil
	case KindSubnet:
		f, ok := w.farms[r.subnet.Farm]
		if !ok {
			return intent.TapEnd{}, fmt.Errorf("subnet %s: its farm has no record", r.ref.Named())
		}
		return intent.TapEnd{Kind: KindSubnet, Farm: f.ID, Subnet: r.subnet.ID}, nil
	}
	ip, err := netip.ParseAddr(r.vm.IP)
	if err != nil || !ip.Is4() {
		return intent.TapEnd{}, fmt.Errorf("vm %s has no IPv4 address (%q)", r.vm.FullName(), r.vm.IP)
	}
	return intent.TapEnd{Kind: KindVM, IP: ip.String()}, nil
}

// narrow applies a vlan filter to the sender: the vlan must be a subnet
// the sender may be in, and then it is the sender (a vlan that cannot
// match is refused rather than stored as a policy that copies nothing).
func (w *World) narrow(snd intent.TapEnd, vlan uint16, sender, monFarm string, monFarmID uint16) (intent.TapEnd, error) {
	fid, sid := SegmentIDs(vlan)
	sub, ok := w.bySeg[uint32(vlan)]
	if !ok {
		return snd, fieldErr("vlan", "vlan %d is farm id %d subnet id %d (farm*%d + subnet), and no subnet has those ids", vlan, fid, sid,
			1<<addrplan.Current().SubnetBits)
	}
	name := sub.Farm + "/" + sub.Name
	switch snd.Kind {
	case KindAny:
		if fid != monFarmID {
			return snd, fieldErr("vlan", "vlan %d is subnet %s, outside farm %s: sender any is any VM of the monitor's farm %s, so the policy would copy nothing", vlan, name, sub.Farm, monFarm)
		}
		return intent.TapEnd{Kind: KindSubnet, Farm: fid, Subnet: sid}, nil
	case KindSubnet:
		if snd.Farm != fid || snd.Subnet != sid {
			return snd, fieldErr("vlan", "vlan %d is subnet %s, but the sender is subnet %s: the policy would copy nothing", vlan, name, sender)
		}
	case KindVM:
		f, s, _, _ := addrplan.Current().Split(netip.MustParseAddr(snd.IP))
		if f != fid || s != sid {
			return snd, fieldErr("vlan", "vlan %d is subnet %s, but the sender %s is not in it: the policy would copy nothing", vlan, name, sender)
		}
	}
	return snd, nil
}

// Rules compiles a stored policy into the rules the datapath holds: one,
// or two with BothDirections (the reverse: ID|intent.TapReverse, sender
// and receiver swapped, sport and dport swapped, no vlan: it narrowed the
// forward sender, which is now the receiver). An error means the policy
// cannot be enforced on today's intent (a VM it names is gone, a peering
// it relied on was withdrawn): it then copies nothing anywhere.
func (w *World) Rules(p intent.TapPolicy) ([]intent.TapRule, error) {
	e, err := w.ends(p)
	if err != nil {
		return nil, fmt.Errorf("tap %s: %w", p.Name, err)
	}
	fwd := intent.TapRule{ID: p.ID, Policy: p.Name, Sender: e.sndEnd, Receiver: e.rcvEnd, TapFilter: p.TapFilter,
		MonitorIP: e.mon.vm.IP, MonitorHost: e.mon.vm.Host}
	if p.Collector != "" {
		fwd.Collector, fwd.Encap = p.Collector, p.Encap
		if fwd.Encap == "" {
			fwd.Encap = EncapERSPAN2
		}
	}
	out := []intent.TapRule{fwd}
	if p.BothDirections {
		rev := fwd
		rev.ID = p.ID | intent.TapReverse
		rev.Sender, rev.Receiver = fwd.Receiver, fwd.Sender
		rev.SportLo, rev.SportHi, rev.DportLo, rev.DportHi = fwd.DportLo, fwd.DportHi, fwd.SportLo, fwd.SportHi
		rev.VLAN = 0
		out = append(out, rev)
	}
	return out, nil
}

// Matches reports whether vm is one of the VMs end names: a host holding
// such a VM is a sender's edge of the rule.
func Matches(end intent.TapEnd, vm intent.VM) bool {
	ip, err := netip.ParseAddr(vm.IP)
	if err != nil || !ip.Is4() {
		return false
	}
	f, s, _, _ := addrplan.Current().Split(ip)
	switch end.Kind {
	case KindVM:
		return end.IP == ip.String()
	case KindSubnet:
		return f == end.Farm && s == end.Subnet
	case KindAny:
		return f == end.Farm
	}
	return false
}

// Describe is a filter in the CLI's words ("proto tcp dport 80"), "all
// traffic" when it has none.
func Describe(f intent.TapFilter) string {
	var out []string
	if f.Proto != 0 {
		out = append(out, "proto "+ProtoName(f.Proto))
	}
	if f.SportLo != 0 {
		out = append(out, "sport "+FormatPorts(f.SportLo, f.SportHi))
	}
	if f.DportLo != 0 {
		out = append(out, "dport "+FormatPorts(f.DportLo, f.DportHi))
	}
	if f.VLAN != 0 {
		out = append(out, fmt.Sprintf("vlan %d", f.VLAN))
	}
	if len(out) == 0 {
		return "all traffic"
	}
	return strings.Join(out, " ")
}
