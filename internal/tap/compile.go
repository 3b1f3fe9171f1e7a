package tap

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/limits"
	"github.com/onehop/onehop/internal/tappolicy"
	"github.com/onehop/onehop/internal/tapwire"
)

// The feature's maps, by their names in bpf/lib/tap_maps.h: what Sizes
// counts and the agent checks against their capacities.
const (
	MapRules   = "tap_rules"   // slot -> a rule's filters and its monitor's target
	MapTargets = "tap_targets" // target slot -> a local monitor's vif or a monitor host's MAC
	MapIndex   = "tap_index"   // (address, role, side, kind) -> the rule slots it can match
	MapConfig  = "tap_config"  // the copy rate each monitor may take
	MapBuckets = "tap_buckets" // datapath: each target's rate bucket
	MapScratch = "tap_scratch" // datapath: per-CPU, a collector's copy being built
	MapStats   = "tap_stats"   // datapath: per-rule, per-CPU counters
)

// MissingMonitor is a rule left out of a plan because where its copies go
// is not known yet: the monitor's vif is not there, or its host has not
// reported its node record. The next pass takes it in.
type MissingMonitor struct {
	Policy string
	ID     uint32
	Why    string
}

// Compile turns one node's TAP rules (n.Desired.Taps) into the TAP plan.
// Copy are the rules whose sender can be a VM of this node (its VLAN filter
// permitting): their monitor is a local VM (its vif's ifindex) or on the
// host n.Nodes names (its uplink MAC). Recover are the rules whose monitor
// is a VM of this node. A rule whose monitor cannot be placed yet is
// listed in Missing, not refused. Pure and deterministic.
//
// It refuses (nothing of the plan is usable) what the controller never
// writes: an end of unknown kind or with a bad address, a port range
// upside down, two rules with one ID, a rule with ID 0.
func Compile(n feature.Node) (Plan, error) {
	p := Plan{UplinkIfindex: n.UplinkIfindex}
	// By address, for the rules' monitors: none to find without rules,
	// and every pass compiles (a host's VMs' worth of copies otherwise).
	var locals map[netip.Addr]intent.LocalEndpoint
	if len(n.Desired.Taps) > 0 {
		locals = make(map[netip.Addr]intent.LocalEndpoint, len(n.Desired.Local))
	}
	if len(n.Desired.Local) > 0 {
		p.Locals = make([]netip.Addr, 0, len(n.Desired.Local))
	}
	for _, l := range n.Desired.Local {
		a, err := netip.ParseAddr(l.IP)
		if err != nil || !a.Is4() {
			return Plan{}, fmt.Errorf("node %s: local VM %s has address %q: not IPv4", n.Name, l.Name, l.IP)
		}
		if locals != nil {
			locals[a] = l
		}
		p.Locals = append(p.Locals, a)
	}
	slices.SortFunc(p.Locals, netip.Addr.Compare)
	hosts := map[string]string{}
	if len(n.Desired.Taps) > 0 { // every pass compiles: without rules, no need of every host's MAC
		for _, nd := range n.Nodes {
			hosts[nd.Name] = nd.UplinkMAC
		}
	}

	rules := slices.Clone(n.Desired.Taps)
	slices.SortFunc(rules, func(a, b intent.TapRule) int { return cmpU32(a.ID, b.ID) })
	seen := map[uint32]bool{}
	for _, r := range rules {
		m, mon, err := compileRule(r)
		if err != nil {
			return Plan{}, fmt.Errorf("node %s: %w", n.Name, err)
		}
		if seen[r.ID] {
			return Plan{}, fmt.Errorf("node %s: tap rule %d (%s) listed twice", n.Name, r.ID, r.Policy)
		}
		seen[r.ID] = true
		missing := func(format string, args ...any) {
			p.Missing = append(p.Missing, MissingMonitor{Policy: r.Policy, ID: r.ID, Why: fmt.Sprintf(format, args...)})
		}
		if r.Collector != "" {
			if c, why := collectorRule(n, m, r); why != "" {
				missing("%s", why)
			} else if slices.ContainsFunc(p.Locals, m.senderMatches) {
				p.Copy = append(p.Copy, c)
			}
			continue
		}
		sends := false
		for _, a := range p.Locals {
			if m.senderMatches(a) {
				sends = true
				break
			}
		}
		ifindex := 0
		if l, ok := locals[mon]; ok {
			if n.Ifindex == nil {
				missing("monitor %s: no interface resolver", mon)
				continue
			}
			i, err := n.Ifindex(l.Interface)
			if err != nil || i <= 0 {
				missing("monitor %s: its vif %s is not there yet", mon, l.Interface)
				continue
			}
			ifindex = i
		}
		if sends {
			c := CopyRule{Match: m, MonitorIP: mon, MonitorIfindex: ifindex}
			if ifindex == 0 {
				mac, why := hostMAC(hosts, r.MonitorHost, n.Name)
				if why != "" {
					missing("monitor %s: %s", mon, why)
					continue
				}
				c.MonitorHostMAC = mac
			}
			p.Copy = append(p.Copy, c)
		}
		if ifindex != 0 {
			p.Recover = append(p.Recover, RecoverRule{Match: m, MonitorIP: mon, MonitorIfindex: ifindex})
		}
	}
	return p, nil
}

// collectorRule is a rule whose copies go to a collector: its MAC as the
// uplink resolved it, and the uplink's own addresses for the outer
// headers; or why it cannot be placed yet.
func collectorRule(n feature.Node, m Match, r intent.TapRule) (CopyRule, string) {
	col, err := netip.ParseAddr(r.Collector)
	if err != nil || !col.Is4() {
		return CopyRule{}, fmt.Sprintf("collector %q: not IPv4", r.Collector)
	}
	if _, ok := encapKinds[r.Encap]; !ok {
		return CopyRule{}, fmt.Sprintf("collector %s: unknown encapsulation %q", col, r.Encap)
	}
	if len(n.Uplinks) == 0 || !n.Uplinks[0].Addr.Is4() || len(n.Uplinks[0].MAC) != 6 {
		return CopyRule{}, fmt.Sprintf("collector %s: the uplink has no IPv4 address to send copies from", col)
	}
	if n.Neighbor == nil {
		return CopyRule{}, fmt.Sprintf("collector %s: no neighbour resolver", col)
	}
	mac, err := n.Neighbor(col)
	if err != nil || len(mac) != 6 {
		return CopyRule{}, fmt.Sprintf("collector %s: its MAC is not known yet (%v)", col, err)
	}
	return CopyRule{Match: m, Collector: col, Encap: r.Encap, CollectorMAC: mac,
		Source: n.Uplinks[0].Addr, UplinkMAC: n.Uplinks[0].MAC}, ""
}

func cmpU32(a, b uint32) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// hostMAC is the uplink MAC of the monitor's host, or why it is not known.
func hostMAC(hosts map[string]string, host, self string) (net.HardwareAddr, string) {
	if host == "" {
		return nil, "no monitor host in the rule"
	}
	if host == self {
		return nil, fmt.Sprintf("placed on this host (%s), but not among its VMs yet", self)
	}
	s, ok := hosts[host]
	if !ok || s == "" {
		return nil, fmt.Sprintf("host %s has not reported its node record yet", host)
	}
	mac, err := net.ParseMAC(s)
	if err != nil || len(mac) != 6 {
		return nil, fmt.Sprintf("host %s reports uplink MAC %q", host, s)
	}
	return mac, ""
}

// compileRule checks one rule and normalizes its filters: a port range
// with only Lo is the one port Lo.
func compileRule(r intent.TapRule) (Match, netip.Addr, error) {
	where := fmt.Sprintf("tap rule %d (%s)", r.ID, r.Policy)
	if r.ID == 0 {
		return Match{}, netip.Addr{}, fmt.Errorf("%s: ID 0", where)
	}
	m := Match{ID: r.ID, Policy: r.Policy, Sender: r.Sender, Receiver: r.Receiver, TapFilter: r.TapFilter}
	for _, e := range []struct {
		what string
		end  *intent.TapEnd
	}{{"sender", &m.Sender}, {"receiver", &m.Receiver}} {
		if err := checkEnd(*e.end); err != nil {
			return Match{}, netip.Addr{}, fmt.Errorf("%s: %s: %w", where, e.what, err)
		}
	}
	for _, pr := range []struct {
		what   string
		lo, hi *uint16
	}{{"source ports", &m.SportLo, &m.SportHi}, {"destination ports", &m.DportLo, &m.DportHi}} {
		if *pr.hi == 0 {
			*pr.hi = *pr.lo
		}
		if *pr.lo > *pr.hi {
			return Match{}, netip.Addr{}, fmt.Errorf("%s: %s %d-%d: upside down", where, pr.what, *pr.lo, *pr.hi)
		}
	}
	if r.Collector != "" {
		return m, netip.Addr{}, nil // collectorRule checks the collector
	}
	mon, err := netip.ParseAddr(r.MonitorIP)
	if err != nil || !mon.Is4() {
		return Match{}, netip.Addr{}, fmt.Errorf("%s: monitor address %q: not IPv4", where, r.MonitorIP)
	}
	return m, mon, nil
}

func checkEnd(e intent.TapEnd) error {
	switch e.Kind {
	case "vm":
		a, err := netip.ParseAddr(e.IP)
		if err != nil || !a.Is4() {
			return fmt.Errorf("vm address %q: not IPv4", e.IP)
		}
	case "subnet", "any":
	default:
		return fmt.Errorf("kind %q: want vm, subnet or any", e.Kind)
	}
	return nil
}

// endMatches reports whether address a is (in) end e.
func endMatches(e intent.TapEnd, a netip.Addr) bool {
	switch e.Kind {
	case "vm":
		ip, _ := netip.ParseAddr(e.IP)
		return ip == a
	case "subnet":
		f, s, _ := addrplan.Current().IDs(a)
		return f == e.Farm && s == e.Subnet
	case "any":
		f, _, _ := addrplan.Current().IDs(a)
		return f == e.Farm
	}
	return false
}

// segment is an address's (or a segment key's) network as onehop numbers
// it for the VLAN filter: tappolicy.Segment (farm*256 + subnet by default).
func segment(a netip.Addr) uint32 {
	f, s, _ := addrplan.Current().IDs(a)
	return tappolicy.Segment(f, s)
}

// senderMatches reports whether a VM at address a is a sender the rule
// names, its VLAN filter included.
func (m Match) senderMatches(a netip.Addr) bool {
	return endMatches(m.Sender, a) && (m.VLAN == 0 || segment(a) == uint32(m.VLAN))
}

// hasPorts reports whether the rule filters on ports (then it matches
// only TCP and UDP).
func (m Match) hasPorts() bool {
	return m.SportLo != 0 || m.SportHi != 0 || m.DportLo != 0 || m.DportHi != 0
}

// Sizes is how many entries the plan puts in each map the feature
// reconciles: a slot per rule, a target per distinct monitor (local vif
// or remote host), an index key per local sender and per distinct
// receiver (and remote sender) a rule names.
func (p Plan) Sizes() feature.Sizes {
	l, err := layoutOf(p)
	if err != nil {
		// Compile's plans lay out; another plan is refused by Sync. A
		// size no map has makes CheckFit refuse it first.
		return feature.Sizes{MapRules: limits.MaxTapRules + 1}
	}
	s := feature.Sizes{MapRules: len(l.rules), MapTargets: len(l.targets), MapIndex: len(l.index), MapConfig: 0}
	if p.InUse() {
		s[MapConfig] = 1
	}
	return s
}

// InUse reports whether the node copies or recovers anything: only then
// does the datapath run the TAP stages.
func (p Plan) InUse() bool { return len(p.Copy) > 0 || len(p.Recover) > 0 }

// target is where one monitor's copies go: a local vif, a remote host, or
// a collector (one per collector, encapsulation and session: each its own
// share).
type target struct {
	ifindex int
	hostMAC string // remote: the host's uplink MAC
	col     collectorTarget
}

// collectorTarget is a collector as a target: what its outer headers say.
type collectorTarget struct {
	addr, mac, src, srcMAC string
	encap                  string
	session                uint16
}

func (t target) String() string {
	if t.col.addr != "" {
		return fmt.Sprintf("collector %s (%s, session %d)", t.col.addr, t.col.encap, t.col.session)
	}
	if t.hostMAC != "" {
		return "host " + t.hostMAC
	}
	return fmt.Sprintf("vif %d", t.ifindex)
}

// indexKey is a tap_index key before it is packed for the datapath.
type indexKey struct {
	addr netip.Addr // 0.0.0.0 for any; 0.f.s.0 for a segment
	role uint8
	side uint8
	kind uint8
}

// Roles, sides and kinds (enum tap_role, tap_side, tap_key_kind in
// bpf/lib/tap_maps.h).
const (
	roleCopy    = uint8(tapTapRoleTAP_ROLE_COPY)
	roleRecover = uint8(tapTapRoleTAP_ROLE_RECOVER)
	sideSender  = uint8(tapTapSideTAP_SIDE_SENDER)
	sideRecv    = uint8(tapTapSideTAP_SIDE_RECEIVER)
	kindIP      = uint8(tapTapKeyKindTAP_KEY_IP)
	kindSegment = uint8(tapTapKeyKindTAP_KEY_SEGMENT)
	kindAny     = uint8(tapTapKeyKindTAP_KEY_ANY)
)

// layout is what the plan puts in the maps, with rules by ID and targets
// by what they are: Sync gives them slots.
type layout struct {
	rules   map[uint32]ruleEntry
	targets []target // sorted: locals by ifindex, then hosts by MAC
	index   map[indexKey][]uint32
}

type ruleEntry struct {
	Match
	target target
}

// farmKey is the index address of "any" VM of a farm: "any" never reaches
// past the farm the policy's monitor may see (tappolicy).
func farmKey(farm uint16) netip.Addr { return addrplan.Current().Key(farm, 0, 0) }

func segmentKey(farm, subnet uint16) netip.Addr { return addrplan.Current().Key(farm, subnet, 0) }

// endKeys are the index keys a receiver (or a remote sender) end is found
// by.
func endKeys(e intent.TapEnd, role, side uint8) indexKey {
	switch e.Kind {
	case "vm":
		a, _ := netip.ParseAddr(e.IP)
		return indexKey{addr: a, role: role, side: side, kind: kindIP}
	case "subnet":
		return indexKey{addr: segmentKey(e.Farm, e.Subnet), role: role, side: side, kind: kindSegment}
	}
	return indexKey{addr: farmKey(e.Farm), role: role, side: side, kind: kindAny}
}

// layoutOf lays the plan out. The VLAN filter lives in the index: a local
// sender's key lists only the rules whose VLAN is its segment, and a remote
// sender "any" with a VLAN is looked up by that segment.
func layoutOf(p Plan) (layout, error) {
	l := layout{rules: map[uint32]ruleEntry{}, index: map[indexKey][]uint32{}}
	tset := map[target]bool{}
	add := func(m Match, t target) error {
		if old, ok := l.rules[m.ID]; ok {
			if old.target != t || !sameMatch(old.Match, m) {
				return fmt.Errorf("tap rule %d (%s): copied to %s and recovered to %s", m.ID, m.Policy, old.target, t)
			}
			return nil
		}
		l.rules[m.ID] = ruleEntry{Match: m, target: t}
		tset[t] = true
		return nil
	}
	index := func(k indexKey, id uint32) {
		if !slices.Contains(l.index[k], id) {
			l.index[k] = append(l.index[k], id)
		}
	}
	for _, c := range p.Copy {
		t := target{ifindex: c.MonitorIfindex}
		if c.Collector.IsValid() {
			if len(c.CollectorMAC) != 6 || len(c.UplinkMAC) != 6 || !c.Source.Is4() {
				return layout{}, fmt.Errorf("tap rule %d (%s): collector %s without its MAC or a source", c.ID, c.Policy, c.Collector)
			}
			t = target{col: collectorTarget{addr: c.Collector.String(), mac: strings.ToLower(c.CollectorMAC.String()),
				src: c.Source.String(), srcMAC: strings.ToLower(c.UplinkMAC.String()), encap: c.Encap, session: tapwire.Session(c.ID)}}
		} else if c.MonitorIfindex == 0 {
			if len(c.MonitorHostMAC) != 6 {
				return layout{}, fmt.Errorf("tap rule %d (%s): monitor %s has neither a vif nor a host MAC", c.ID, c.Policy, c.MonitorIP)
			}
			t = target{hostMAC: strings.ToLower(c.MonitorHostMAC.String())}
		}
		if err := add(c.Match, t); err != nil {
			return layout{}, err
		}
		for _, a := range p.Locals {
			if c.senderMatches(a) {
				index(indexKey{addr: a, role: roleCopy, side: sideSender, kind: kindIP}, c.ID)
			}
		}
		index(endKeys(c.Receiver, roleCopy, sideRecv), c.ID)
	}
	for _, r := range p.Recover {
		if r.MonitorIfindex <= 0 {
			return layout{}, fmt.Errorf("tap rule %d (%s): monitor %s recovered here without a vif", r.ID, r.Policy, r.MonitorIP)
		}
		if err := add(r.Match, target{ifindex: r.MonitorIfindex}); err != nil {
			return layout{}, err
		}
		index(endKeys(r.Receiver, roleRecover, sideRecv), r.ID)
		// The sender, with the VLAN filter folded in; a sender the VLAN
		// excludes can match nothing, so it gets no key.
		k := endKeys(r.Sender, roleRecover, sideSender)
		if r.VLAN != 0 {
			seg := segmentKey(tappolicy.SegmentIDs(r.VLAN))
			switch r.Sender.Kind {
			case "any":
				k = indexKey{addr: seg, role: roleRecover, side: sideSender, kind: kindSegment}
			case "subnet":
				if k.addr != seg {
					continue
				}
			case "vm":
				if segment(k.addr) != uint32(r.VLAN) {
					continue
				}
			}
		}
		index(k, r.ID)
	}
	for t := range tset {
		l.targets = append(l.targets, t)
	}
	slices.SortFunc(l.targets, func(a, b target) int {
		if a.col != b.col {
			return strings.Compare(a.col.String(), b.col.String()) // none ("") first
		}
		if a.hostMAC != b.hostMAC {
			return strings.Compare(a.hostMAC, b.hostMAC) // "" (local) first
		}
		return a.ifindex - b.ifindex
	})
	for k := range l.index {
		slices.Sort(l.index[k])
	}
	return l, nil
}

func sameMatch(a, b Match) bool {
	return a.ID == b.ID && a.Policy == b.Policy && a.Sender == b.Sender && a.Receiver == b.Receiver && a.TapFilter == b.TapFilter
}
