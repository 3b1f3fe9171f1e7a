package trace

import (
	"fmt"
	"net"
	"strings"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/filter"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/tappolicy"
)

// Endpoint is one end of a traced packet as the controller resolved it.
type Endpoint struct {
	// Kind is what the end is: "vm", "sliver", "host" (a host's own
	// address on the fabric), "external" (outside the tenant space and
	// no host's), or "address" (in the tenant space, no VM's).
	Kind string `json:"kind,omitempty"`
	Name string `json:"name,omitempty"` // farm/subnet/vm, host/sliver, or the host; "" for an address
	IP   string `json:"ip"`
	Host string `json:"host,omitempty"` // the VM's, sliver's or address's host
	// Uplink is the index of the host's uplink whose address IP is (a
	// sliver's, a host's): the link the frame goes out or comes in by.
	Uplink int `json:"uplink,omitempty"`
	// VM is the VM's record (for its firewall's rule ids); not shown.
	VM *intent.VM `json:"-"`
	// Sliver is the sliver's record (its slot); not shown.
	Sliver *intent.Sliver `json:"-"`
}

// Endpoint kinds.
const (
	KindVM       = "vm"
	KindSliver   = "sliver"
	KindHost     = "host"
	KindExternal = "external"
	KindAddress  = "address"
)

// ExternalMAC is the source MAC of a traced frame from an external: no
// host's, as a frame from the fabric's router or a machine outside onehop.
var ExternalMAC = net.HardwareAddr{0x02, 0x74, 0x72, 0x00, 0x00, 0x01}

// Report is the answer to a trace: each host's program run, explained.
type Report struct {
	Request Request  `json:"request"`
	From    Endpoint `json:"from"`
	To      Endpoint `json:"to"`
	// Verdict is the end of the path: "delivered", "dropped", "held"
	// (waiting for the mapping table), "to agent" or "to host stack".
	Verdict string `json:"verdict"`
	// Drop is the drop reason (the onehop_dropped_packets_total reason
	// label a real packet would count) and DropHost where.
	Drop     string `json:"drop,omitempty"`
	DropHost string `json:"dropHost,omitempty"`
	Hops     []Hop  `json:"hops"`
}

// Hop is one host's program on the path.
type Hop struct {
	Host    string `json:"host"`
	Program string `json:"program"`
	Run     Run    `json:"run"`
	// Rules are the visibility rules (by farm and id, as `onehop rule
	// list` shows them) that let the packet between subnets here.
	Rules []RuleRef `json:"rules,omitempty"`
	// Firewall names the firewall rule (by id, as `onehop firewall list`
	// shows it) or default that decided, per VM and direction.
	Firewall []FirewallRef `json:"firewall,omitempty"`
	// NextHost is the host whose uplink MAC the frame leaves for.
	NextHost string   `json:"nextHost,omitempty"`
	Steps    []string `json:"steps"`
}

// RuleRef names a visibility rule.
type RuleRef struct {
	Farm string `json:"farm"`
	ID   uint32 `json:"id"`
	Text string `json:"text"`
}

// FirewallRef names what decided in one VM's firewall: rule ID, or its
// default (ID 0).
type FirewallRef struct {
	VM    string `json:"vm"`
	Dir   string `json:"dir"`
	ID    uint32 `json:"id,omitempty"`
	Allow bool   `json:"allow"`
}

// Intent is what the explanation names things from.
type Intent struct {
	Farms   []intent.Farm
	Subnets []intent.Subnet
	Nodes   []intent.Node
}

// HostOfMAC is the host whose uplink has mac, "" when none.
func (in Intent) HostOfMAC(mac net.HardwareAddr) string {
	host, _ := in.UplinkOfMAC(mac)
	return host
}

// UplinkOfMAC is the host whose uplink has mac and that uplink's index,
// "" when none.
func (in Intent) UplinkOfMAC(mac net.HardwareAddr) (string, int) {
	for _, n := range in.Nodes {
		for _, u := range n.Uplinks {
			if strings.EqualFold(u.MAC, mac.String()) {
				return n.Name, u.Index
			}
		}
		if strings.EqualFold(n.UplinkMAC, mac.String()) {
			return n.Name, 0
		}
	}
	return "", 0
}

// Uplink is the address and MAC of uplink index of host.
func (in Intent) Uplink(host string, index int) (ip, mac string, ok bool) {
	for _, n := range in.Nodes {
		if n.Name != host {
			continue
		}
		for _, u := range n.Uplinks {
			if u.Index == index {
				return u.IP, u.MAC, true
			}
		}
		if index == 0 && n.UplinkIP != "" {
			return n.UplinkIP, n.UplinkMAC, true
		}
	}
	return "", "", false
}

// UplinkOfIP is the host whose uplink has address ip and that uplink's
// index, "" when none.
func (in Intent) UplinkOfIP(ip string) (string, int) {
	for _, n := range in.Nodes {
		for _, u := range n.Uplinks {
			if u.IP == ip {
				return n.Name, u.Index
			}
		}
		if n.UplinkIP == ip {
			return n.Name, 0
		}
	}
	return "", 0
}

func (in Intent) subnetName(farm, subnet uint16) string {
	farmName := ""
	for _, f := range in.Farms {
		if f.ID == farm {
			farmName = f.Name
		}
	}
	for _, s := range in.Subnets {
		if s.Farm == farmName && s.ID == subnet {
			return s.Farm + "/" + s.Name
		}
	}
	return addrplan.Current().SubnetPrefix(farm, subnet).String()
}

// VisRules names the rules behind the visibility key v matched: within a
// farm, the rule written exactly as the key (else those that cover it);
// across farms, every rule of either farm that covers it, since the key
// is what both farms' rules allow (policy.Visibility).
func (in Intent) VisRules(v VisHit) []RuleRef {
	from, to := in.subnetName(v.SrcFarm, v.SrcSubnet), in.subnetName(v.DstFarm, v.DstSubnet)
	var exact, cover []RuleRef
	for _, f := range in.Farms {
		for _, r := range f.Rules {
			p, err := filter.ProtoNumber(r.Proto)
			if err != nil || r.From != from || r.To != to {
				continue
			}
			ref := RuleRef{Farm: f.Name, ID: r.ID, Text: ruleText(r)}
			if p == v.Proto && r.Port == v.Port {
				exact = append(exact, ref)
			} else if (p == 0 || p == v.Proto) && (r.Port == 0 || r.Port == v.Port) {
				cover = append(cover, ref)
			}
		}
	}
	if v.SrcFarm == v.DstFarm && len(exact) > 0 {
		return exact
	}
	return append(exact, cover...)
}

func ruleText(r intent.Rule) string {
	s := r.From + " -> " + r.To
	if r.Proto != "" {
		s += " " + r.Proto
		if r.Port != 0 {
			s += fmt.Sprintf("/%d", r.Port)
		}
	}
	return s
}

// firewallRef names the rule the datapath's hit h is in vm's firewall.
func firewallRef(vm *intent.VM, h FwHit) FirewallRef {
	ref := FirewallRef{Dir: h.Dir, Allow: h.Allow}
	if vm == nil {
		return ref
	}
	ref.VM = vm.FullName()
	if h.How != "rule" || vm.Firewall == nil {
		return ref
	}
	i := 0
	for _, r := range vm.Firewall.Rules {
		if r.Dir != h.Dir {
			continue
		}
		if i == h.Index {
			ref.ID = r.ID
			break
		}
		i++
	}
	return ref
}

// Explain makes a hop of run on host: what decided, by name and id, and
// what became of the packet, as lines a person reads.
func (in Intent) Explain(host string, run Run, req Request, from, to Endpoint) Hop {
	h := Hop{Host: host, Program: run.Program, Run: run}
	say := func(format string, a ...any) { h.Steps = append(h.Steps, fmt.Sprintf(format, a...)) }
	switch {
	case run.Program == ProgramVif:
		say("%s: the vif program of %s", host, nameOr(from))
		if strings.HasPrefix(run.Drop, "spoofed_") || run.Drop == "vlan_tagged" || run.Drop == "reserved_flag" {
			say("anti-spoofing: refused (%s)", run.Drop)
		} else if run.Drop != "unknown_vif" {
			say("anti-spoofing: source MAC and address are %s's own", nameOr(from))
		}
	case run.Program == ProgramSliver:
		say("%s: port space's program on the link of sliver %s", host, nameOr(from))
		if strings.HasPrefix(run.Drop, "ps_") || run.Drop == "malformed" {
			say("port space: refused (%s)", run.Drop)
		} else {
			say("port space: from its host's address and MAC, from a port (or echo id) of its own lease")
		}
	default:
		say("%s: the uplink program, on the frame as it arrives from the fabric", host)
		switch {
		case strings.HasPrefix(run.Drop, "fabric_"):
			say("fabric trust: refused (%s)", run.Drop)
		case contains(run.Forwards, "egress_in"):
			say("egress: a reply to a flow of a VM's slice of %s's address: translated back to the VM", host)
		case contains(run.Forwards, "to_sliver"):
			say("port space: to %s's shared address: steered by port (or echo id) to the sliver that leases it", host)
		case contains(run.Forwards, "host_stack"):
			say("not tenant traffic: for %s's own stack (no sliver holds the port, and no VM's live flow from this sender)", host)
		default:
			say("fabric trust: sent by a known host, from an address a VM may hold")
		}
	}
	if v := run.Visibility; v != nil {
		if v.Match != "" {
			h.Rules = in.VisRules(*v)
			var names []string
			for _, r := range h.Rules {
				names = append(names, fmt.Sprintf("rule %d of farm %s (%s)", r.ID, r.Farm, r.Text))
			}
			if len(names) == 0 {
				names = []string{"a rule no longer in the intent (the host has not caught up)"}
			}
			say("visibility: %s -> %s %s allowed by %s", in.subnetName(v.SrcFarm, v.SrcSubnet), in.subnetName(v.DstFarm, v.DstSubnet), protoPort(*v), strings.Join(names, ", "))
		} else {
			// No key matched: the last one looked up is the widest (any
			// protocol); the packet is what no rule allows.
			what := req.Proto
			if req.Dport != 0 {
				what += fmt.Sprintf("/%d", req.Dport)
			}
			say("visibility: no rule allows %s -> %s %s", in.subnetName(v.SrcFarm, v.SrcSubnet), in.subnetName(v.DstFarm, v.DstSubnet), what)
		}
	}
	for _, f := range run.Firewall {
		vm := to.VM
		if f.Dir == "out" {
			vm = from.VM
		}
		ref := firewallRef(vm, f)
		h.Firewall = append(h.Firewall, ref)
		verdict := "denies"
		if f.Allow {
			verdict = "allows"
		}
		switch f.How {
		case "rule":
			say("firewall %s of %s: rule %d %s", f.Dir, ref.VM, ref.ID, verdict)
		case "default":
			say("firewall %s of %s: no rule matches; its default %s", f.Dir, ref.VM, verdict)
		default:
			say("firewall %s of %s: a rule the host's table promises is missing: refused", f.Dir, ref.VM)
		}
	}
	switch run.Conntrack {
	case "new":
		say("conntrack: no flow yet; a real packet allowed here would open one (the trace opened none)")
	case "established":
		say("conntrack: passes on the flow it belongs to")
	case "reply":
		say("conntrack: passes as the answer of a flow this host admitted")
	case "rechecked":
		say("conntrack: a flow admitted under older rules, checked again against the rules in force")
	}
	switch {
	case run.Drop != "":
		say("dropped: %s (a real packet counts onehop_dropped_packets_total{reason=%q} on %s)", run.Drop, run.Drop, host)
	case run.Slow == "hold":
		if run.Ask {
			say("held: %s does not know which host holds %s; a real packet is held by the agent, which asks the fabric (the trace asked nothing)", host, to.IP)
		} else {
			say("held: %s is being asked for already; a real packet waits with the others for the answer", to.IP)
		}
	case run.Slow != "":
		say("handed to the agent (%s)", run.Slow)
	case contains(run.Forwards, "egress_out"):
		say("leaves the tenant space through %s's egress (a port of its slice of the host's address); the trace stops there: the farm's egress list and the slice are not traced", host)
	case run.Verdict == "pass":
		say("to the host's own stack")
	case run.Verdict == "redirect" && len(run.Out) >= 6 && contains(run.Forwards, "from_sliver"):
		mac := net.HardwareAddr(run.Out[:6])
		h.NextHost = in.HostOfMAC(mac)
		if h.NextHost != "" {
			say("route: to host %s (uplink MAC %s) on the fabric, out of %s", h.NextHost, mac, ifName(run))
		} else {
			say("sent: out of %s onto the fabric, beyond onehop (to MAC %s)", ifName(run), mac)
		}
	case run.Verdict == "redirect" && contains(run.Forwards, "to_sliver"):
		say("delivered: into the sliver on %s (%s)", ifName(run), run.ToKind)
	case run.Verdict == "redirect" && len(run.Out) >= 6 && contains(run.Forwards, "to_fabric"):
		mac := net.HardwareAddr(run.Out[:6])
		h.NextHost = in.HostOfMAC(mac)
		say("route: one hop to host %s (uplink MAC %s), out of %s", orUnknown(h.NextHost), mac, ifName(run))
	case run.Verdict == "redirect":
		say("delivered: into %s through %s (%s)", nameOr(to), ifName(run), run.ToKind)
	}
	return h
}

// Finish sets the report's verdict from its last hop.
func (r *Report) Finish() {
	if len(r.Hops) == 0 {
		return
	}
	last := r.Hops[len(r.Hops)-1]
	run := last.Run
	switch {
	case run.Drop != "":
		r.Verdict, r.Drop, r.DropHost = "dropped", run.Drop, last.Host
	case run.Slow == "hold":
		r.Verdict = "held"
	case run.Slow != "":
		r.Verdict = "to agent"
	case contains(run.Forwards, "egress_out"):
		r.Verdict = "egress"
	case run.Verdict == "pass":
		r.Verdict = "to host stack"
	case contains(run.Forwards, "to_fabric"), contains(run.Forwards, "from_sliver") && last.NextHost == "":
		// No host of the intent has that MAC (or, from a sliver, beyond onehop).
		r.Verdict = "to fabric"
	case run.Verdict == "redirect":
		r.Verdict = "delivered"
	default:
		r.Verdict = run.Verdict
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func nameOr(e Endpoint) string {
	if e.Name != "" {
		return e.Name
	}
	return e.IP
}

func orUnknown(s string) string {
	if s == "" {
		return "(no host of the intent has this MAC)"
	}
	return s
}

func ifName(run Run) string {
	if run.ToName != "" {
		return fmt.Sprintf("%s (ifindex %d)", run.ToName, run.To)
	}
	return fmt.Sprintf("ifindex %d", run.To)
}

func protoPort(v VisHit) string {
	s := tappolicy.ProtoName(v.Proto)
	if v.Port != 0 {
		s += fmt.Sprintf("/%d", v.Port)
	}
	return s
}
