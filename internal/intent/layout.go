package intent

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/onehop/onehop/internal/addrplan"
)

// The desired state lives in many small keys, so that one change writes a
// bounded number of them whatever the cloud's size, and an agent watches
// only what concerns its host (docs/control-plane.md):
//
//	/onehop/desired/HOST/vm/FARM/SUBNET/VM  LocalEndpoint: one per VM of HOST
//	/onehop/desired/HOST/sliver/NAME        LocalSliver: one per sliver of HOST
//	/onehop/desired/HOST/tap/ID             TapRule: one per TAP rule HOST plays a part in
//	/onehop/farmstate/FFF                   FarmState: one per farm (id, 3 digits), shared
//
// An agent watches its host's prefix and the farm states of the farms its
// VMs belong to, and assembles them into a Desired (Assemble).
const (
	// FarmStatePrefix holds one FarmState per farm, under its id written
	// with three digits (so that one farm's key is never a prefix of
	// another's).
	FarmStatePrefix = Root + "farmstate/"
)

// The kinds of key under a host's desired prefix:
// DesiredKindPrefix(HOST, KIND) + NAME. Each is written by one part of the
// controller (controller/records.go) and read by the agents (View).
const (
	DesiredVMKind     = "vm"
	DesiredSliverKind = "sliver"
	DesiredTapKind    = "tap"
)

// DesiredHostPrefix is the prefix of every desired key of host.
func DesiredHostPrefix(host string) string { return DesiredPrefix + host + "/" }

// DesiredKindPrefix is the prefix of host's desired keys of one kind.
func DesiredKindPrefix(host, kind string) string { return DesiredHostPrefix(host) + kind + "/" }

// ParseDesiredKey splits a key under DesiredPrefix into its host, kind and
// name (the rest); each is "" where the key ends before it (the
// one-value-per-host layout of before has a host alone). ok is false for a
// key not under DesiredPrefix.
func ParseDesiredKey(key string) (host, kind, name string, ok bool) {
	rest, ok := strings.CutPrefix(key, DesiredPrefix)
	if !ok {
		return "", "", "", false
	}
	host, rest, _ = strings.Cut(rest, "/")
	kind, name, _ = strings.Cut(rest, "/")
	return host, kind, name, true
}

// DesiredVMKey is the key of a VM (farm/subnet/vm) in its host's desired state.
func DesiredVMKey(host, vm string) string { return DesiredKindPrefix(host, DesiredVMKind) + vm }

// DesiredSliverKey is the key of a sliver in its host's desired state.
func DesiredSliverKey(host, sliver string) string {
	return DesiredKindPrefix(host, DesiredSliverKind) + sliver
}

// DesiredTapKey is the key of a TAP rule in the desired state of a host that
// plays a part in it.
func DesiredTapKey(host string, id uint32) string {
	return DesiredKindPrefix(host, DesiredTapKind) + fmt.Sprintf("%010d", id)
}

// FarmStateKey is the key of farm id's state.
// At least three digits, as before farm ids grew past 255 (addrplan).
func FarmStateKey(id uint16) string { return FarmStatePrefix + fmt.Sprintf("%03d", id) }

// FarmState is what every host carrying a VM of the farm needs of it, kept
// once for all of them: a change of a farm's rules or peerings writes this
// one key.
type FarmState struct {
	ID       uint16 `json:"id"`
	Name     string `json:"name,omitempty"`
	ProxyARP bool   `json:"proxyARP,omitempty"`
	// Visibility is every compiled rule from or to a subnet of the farm.
	Visibility []VisRule `json:"visibility"`
}

// FarmOf returns the farm id of a VM address (the f of 10.f.s.h in the
// default plan), or false.
func FarmOf(ip string) (uint16, bool) {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return 0, false
	}
	return addrplan.Current().FarmOf(a)
}

// SortVisRules puts rules in the one order the desired state lists them in:
// by their text as fmt.Sprint writes it ("{1 2 3 4 6 443}"). Every agent
// sorts its rules on every pass, so each rule's text is made once, not at
// every comparison (formatting in the comparison was a fifth of a
// simulated agent's CPU in the scale harness).
func SortVisRules(rules []VisRule) {
	type keyed struct {
		key  string
		rule VisRule
	}
	ks := make([]keyed, len(rules))
	var buf []byte
	for i, r := range rules {
		buf = appendVisRuleText(buf[:0], r)
		ks[i] = keyed{string(buf), r}
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i].key < ks[j].key })
	for i := range ks {
		rules[i] = ks[i].rule
	}
}

// appendVisRuleText appends r as fmt.Sprint(r) writes it.
func appendVisRuleText(b []byte, r VisRule) []byte {
	b = append(b, '{')
	for i, v := range []uint64{uint64(r.SrcFarm), uint64(r.SrcSubnet), uint64(r.DstFarm), uint64(r.DstSubnet), uint64(r.Proto), uint64(r.Port)} {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendUint(b, v, 10)
	}
	return append(b, '}')
}

// HostKeys is one host's desired keys: key (full) to value.
type HostKeys map[string][]byte

// Assemble builds node's Desired from its desired keys (hostKeys, keys under
// DesiredHostPrefix(node)) and the states of the farms its VMs belong to
// (farms missing from farms contribute nothing yet). The result does not
// depend on the order anything was written in: local VMs by address, rules
// as SortVisRules, slivers by slot, TAP rules by id.
func Assemble(node string, hostKeys HostKeys, farms map[uint16]FarmState) (Desired, error) {
	v := NewView(node)
	for k, b := range hostKeys {
		if err := v.Set(k, b); err != nil {
			return Desired{Node: node}, err
		}
	}
	for _, f := range farms {
		v.SetFarm(f)
	}
	return v.Desired(), nil
}

// View is one host's desired state as its keys, decoded, changed key by
// key as a watch reports them: what an agent keeps between events, so that
// an event costs the decoding of what it carries.
type View struct {
	node    string
	prefix  string
	local   map[string]LocalEndpoint
	slivers map[string]LocalSliver
	taps    map[string]TapRule
	farms   map[uint16]FarmState
	// sorted is local in Desired's order, kept as keys change (nil: made
	// again by the next Desired), and carried by farm how many of local
	// belong to each farm: so that a change of one VM costs a pass no
	// sort and no walk of the host's VMs (issue 20, item 18). A slice
	// handed out by Desired is never changed: a change makes a new one.
	sorted  []LocalEndpoint
	carried map[uint16]int
}

// NewView returns the empty view of node.
func NewView(node string) *View {
	return &View{node: node, prefix: DesiredHostPrefix(node), local: map[string]LocalEndpoint{},
		slivers: map[string]LocalSliver{}, taps: map[string]TapRule{}, farms: map[uint16]FarmState{},
		carried: map[uint16]int{}}
}

// Set takes one of the host's keys' new value. A key of a kind it does not
// know is ignored (forward compatibility); a value that does not decode is
// an error.
func (v *View) Set(k string, b []byte) error {
	rest, ok := strings.CutPrefix(k, v.prefix)
	if !ok {
		return fmt.Errorf("desired key %s is not under %s", k, v.prefix)
	}
	kind, _, named := strings.Cut(rest, "/")
	if !named {
		kind = "" // a host's key of no kind: none this version writes
	}
	var err error
	switch kind {
	case DesiredVMKind:
		var l LocalEndpoint
		if err = json.Unmarshal(b, &l); err == nil {
			v.dropLocal(k)
			v.local[k] = l
			v.carry(l, 1)
			if v.sorted != nil {
				i, _ := slices.BinarySearchFunc(v.sorted, l, compareLocal)
				v.sorted = slices.Insert(slices.Clip(v.sorted), i, l)
			}
		}
	case DesiredSliverKind:
		var s LocalSliver
		if err = json.Unmarshal(b, &s); err == nil {
			v.slivers[k] = s
		}
	case DesiredTapKind:
		var r TapRule
		if err = json.Unmarshal(b, &r); err == nil {
			v.taps[k] = r
		}
	default:
		// A kind of key a newer controller writes for a feature this
		// agent does not have: not this agent's to apply, and no reason
		// to stop applying the rest.
	}
	if err != nil {
		return fmt.Errorf("desired key %s: %w", k, err)
	}
	return nil
}

// Delete drops one of the host's keys.
func (v *View) Delete(k string) {
	v.dropLocal(k)
	delete(v.slivers, k)
	delete(v.taps, k)
}

// dropLocal drops k's local VM, if any, from local, sorted and carried.
func (v *View) dropLocal(k string) {
	l, ok := v.local[k]
	if !ok {
		return
	}
	delete(v.local, k)
	v.carry(l, -1)
	if v.sorted == nil {
		return
	}
	i, found := slices.BinarySearchFunc(v.sorted, l, compareLocal)
	if !found || !reflect.DeepEqual(v.sorted[i], l) {
		v.sorted = nil // two keys of one name and address: sort again
		return
	}
	v.sorted = slices.Delete(slices.Clone(v.sorted), i, i+1)
}

// carry counts l in (n 1) or out of (n -1) its farm.
func (v *View) carry(l LocalEndpoint, n int) {
	if f, ok := FarmOf(l.IP); ok {
		if v.carried[f] += n; v.carried[f] == 0 {
			delete(v.carried, f)
		}
	}
}

// compareLocal is the order of Desired.Local: by address, then name.
func compareLocal(a, b LocalEndpoint) int {
	if c := strings.Compare(a.IP, b.IP); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

// SetFarm takes a farm's state.
func (v *View) SetFarm(f FarmState) { v.farms[f.ID] = f }

// DeleteFarm drops a farm's state.
func (v *View) DeleteFarm(id uint16) { delete(v.farms, id) }

// Farms lists, ascending, the farms whose state the view needs: those its
// VMs belong to.
func (v *View) Farms() []uint16 {
	var out []uint16
	for f, n := range v.carried {
		if n > 0 {
			out = append(out, f)
		}
	}
	slices.Sort(out)
	return out
}

// Keys is how many host keys the view holds.
func (v *View) Keys() int { return len(v.local) + len(v.slivers) + len(v.taps) }

// Desired assembles the view (see Assemble for the order).
func (v *View) Desired() Desired {
	if v.sorted == nil {
		v.sorted = make([]LocalEndpoint, 0, len(v.local))
		for _, l := range v.local {
			v.sorted = append(v.sorted, l)
		}
		slices.SortFunc(v.sorted, compareLocal)
	}
	d := Desired{Node: v.node, VMNet: addrplan.Current().Prefix.String(), Local: slices.Clip(v.sorted), Visibility: []VisRule{}}
	for _, s := range v.slivers {
		d.Slivers = append(d.Slivers, s)
	}
	for _, r := range v.taps {
		d.Taps = append(d.Taps, r)
	}
	sort.Slice(d.Slivers, func(i, j int) bool {
		a, b := d.Slivers[i], d.Slivers[j]
		return a.Slot < b.Slot || (a.Slot == b.Slot && a.Name < b.Name)
	})
	sort.Slice(d.Taps, func(i, j int) bool {
		return d.Taps[i].ID < d.Taps[j].ID || (d.Taps[i].ID == d.Taps[j].ID && d.Taps[i].Policy < d.Taps[j].Policy)
	})
	seen := map[VisRule]bool{}
	for _, id := range v.Farms() {
		f, ok := v.farms[id]
		if !ok {
			continue
		}
		if f.ProxyARP {
			d.ProxyARPFarms = append(d.ProxyARPFarms, id)
		}
		for _, r := range f.Visibility {
			if !seen[r] {
				seen[r] = true
				d.Visibility = append(d.Visibility, r)
			}
		}
	}
	SortVisRules(d.Visibility)
	return d
}

// CarriedFarms lists, ascending, the farms the local VMs belong to: the
// farms whose state a host needs.
func CarriedFarms(local []LocalEndpoint) []uint16 {
	var out []uint16
	for _, l := range local {
		if f, ok := FarmOf(l.IP); ok {
			out = append(out, f)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Split is Assemble's inverse, for writers of a whole Desired (tests, a
// migration): the host's keys, and the farm states its rules and proxy-ARP
// farms make (a rule goes to the states of both farms it joins).
func Split(d Desired) (HostKeys, map[uint16]FarmState, error) {
	keys := HostKeys{}
	put := func(k string, v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode %s: %w", k, err)
		}
		keys[k] = b
		return nil
	}
	for _, l := range d.Local {
		if err := put(DesiredVMKey(d.Node, l.Name), l); err != nil {
			return nil, nil, err
		}
	}
	for _, s := range d.Slivers {
		if err := put(DesiredSliverKey(d.Node, s.Name), s); err != nil {
			return nil, nil, err
		}
	}
	for _, r := range d.Taps {
		if err := put(DesiredTapKey(d.Node, r.ID), r); err != nil {
			return nil, nil, err
		}
	}
	farms := map[uint16]FarmState{}
	state := func(id uint16) FarmState {
		f, ok := farms[id]
		if !ok {
			f = FarmState{ID: id, Visibility: []VisRule{}}
		}
		return f
	}
	for _, id := range d.ProxyARPFarms {
		f := state(id)
		f.ProxyARP = true
		farms[id] = f
	}
	for _, r := range d.Visibility {
		for _, id := range []uint16{r.SrcFarm, r.DstFarm} {
			f := state(id)
			if len(f.Visibility) == 0 || f.Visibility[len(f.Visibility)-1] != r {
				f.Visibility = append(f.Visibility, r)
			}
			farms[id] = f
		}
	}
	return keys, farms, nil
}

// ParseFarmStateKey returns the farm id a FarmStateKey names.
func ParseFarmStateKey(k string) (uint16, bool) {
	rest, ok := strings.CutPrefix(k, FarmStatePrefix)
	if !ok || len(rest) < 3 || len(rest) > 5 {
		return 0, false
	}
	n, err := strconv.ParseUint(rest, 10, 16)
	return uint16(n), err == nil
}
