package topology

import (
	"errors"
	"net/netip"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/onehop/onehop/internal/tappolicy"
)

// Tap is a virtual TAP policy (docs/tap.md): copies of what Sender sends
// Receiver go to Monitor, or to Collector, an address on the fabric, as
// Encap. The fields are the CLI's (onehop tap create).
type Tap struct {
	tappolicy.Spec
	Line int `yaml:"-"`
	// Lines of each key's value, by key, so an error points at the field.
	Lines map[string]int `yaml:"-"`
}

const tapsKey = "taps"

var tapsSection = section{
	key: tapsKey,
	decode: func(d *decoder, v *yaml.Node, f *File) {
		var ts []Tap
		d.report(d.seq("taps", func(item *yaml.Node) {
			t := Tap{Line: item.Line, Lines: map[string]int{}}
			line := func(key string, set field) field {
				return func(v *yaml.Node) error { t.Lines[key] = v.Line; return set(v) }
			}
			d.mapping(item, "tap", map[string]field{
				"name":            line("name", d.str(&t.Name, "tap name")),
				"sender":          line("sender", d.str(&t.Sender, "tap sender")),
				"receiver":        line("receiver", d.str(&t.Receiver, "tap receiver")),
				"monitor":         line("monitor", d.str(&t.Monitor, "tap monitor")),
				"collector":       line("collector", d.str(&t.Collector, "tap collector")),
				"encap":           line("encap", d.str(&t.Encap, "tap encap")),
				"proto":           line("proto", d.str(&t.Proto, "tap proto")),
				"sport":           line("sport", d.str(&t.Sport, "tap sport")),
				"dport":           line("dport", d.str(&t.Dport, "tap dport")),
				"vlan":            line("vlan", d.str(&t.VLAN, "tap vlan")),
				"both_directions": line("both_directions", d.flag(&t.BothDirections, "tap both_directions")),
				"cross_farm":      line("cross_farm", d.flag(&t.CrossFarm, "tap cross_farm")),
			})
			ts = append(ts, t)
		})(v))
		setExtra(f, tapsKey, ts)
	},
	validate: validateTaps,
}

// lineOf is the line of key's value, or the tap's own line.
func (t Tap) lineOf(key string) int { return orLine(t.Lines[key], t.Line) }

// validateTaps checks what the file alone can say: the syntax (the
// controller's own checks), that the VMs and subnets named by name are in
// the file, and the tenancy rule on the farms and peerings the file gives;
// a collector must be on the file's fabric and no host's own address. A
// VM named by its IP or MAC is resolved by the controller when it applies
// the file (addresses are allocated then), with this file's line; so is a
// collector against the hosts' later uplinks (uplinksSection).
func validateTaps(c *checker, f *File) {
	seen := map[string]int{}
	peers := func(a, b string) bool {
		var fa, fb *Farm
		for i := range f.Farms {
			switch f.Farms[i].Name {
			case a:
				fa = &f.Farms[i]
			case b:
				fb = &f.Farms[i]
			}
		}
		return fa != nil && fb != nil && slices.Contains(fa.Peers, b) && slices.Contains(fb.Peers, a)
	}
	for _, t := range f.Taps() {
		if first, dup := seen[t.Name]; dup && t.Name != "" {
			c.fail(t.lineOf("name"), "duplicate tap %q (first defined on line %d)", t.Name, first)
			continue
		}
		seen[t.Name] = t.Line
		if _, err := tappolicy.ParseSpec(t.Spec); err != nil {
			var fe *tappolicy.FieldError
			if errors.As(err, &fe) {
				c.fail(t.lineOf(fe.Field), "tap %q: %s: %s", t.Name, fe.Field, fe.Msg)
			} else {
				c.fail(t.Line, "tap %q: %v", t.Name, err)
			}
			continue
		}
		if t.Collector != "" && !c.collectorOnFabric(t) {
			continue
		}
		farms := map[string]string{} // role -> farm, for the ends named by name
		byAddr := false              // an end named by its IP or MAC: its farm is the controller's to know
		ok := true
		vmNames := map[string]string{}
		for _, role := range []string{"sender", "receiver", "monitor"} {
			s := map[string]string{"sender": t.Sender, "receiver": t.Receiver, "monitor": t.Monitor}[role]
			if s == "" {
				continue // the monitor of a policy with a collector
			}
			ref, _ := tappolicy.ParseRef(s) // ParseSpec read it
			switch ref.Kind {
			case tappolicy.KindVM:
				if _, found := f.VMOf(ref.Farm, ref.Subnet, ref.Name); !found {
					c.fail(t.lineOf(role), "tap %q: %s %s is not a VM of this file (vms: name %s, subnet %s/%s)", t.Name, role, s, ref.Name, ref.Farm, ref.Subnet)
					ok = false
					continue
				}
				farms[role] = ref.Farm
				vmNames[role] = ref.Farm + "/" + ref.Subnet + "/" + ref.Name
			case tappolicy.KindSubnet:
				if !c.subnets[ref.Farm+"/"+ref.Subnet] {
					c.fail(t.lineOf(role), "tap %q: %s %s is not a subnet of this file", t.Name, role, s)
					ok = false
					continue
				}
				farms[role] = ref.Farm
			case tappolicy.KindAny:
			default:
				byAddr = true
			}
		}
		if !ok {
			continue
		}
		if vmNames["sender"] != "" && vmNames["sender"] == vmNames["receiver"] {
			c.fail(t.lineOf("receiver"), "tap %q: receiver %s is also the sender: a VM's traffic to itself never leaves it", t.Name, t.Receiver)
			continue
		}
		for _, role := range []string{"sender", "receiver"} {
			if vmNames[role] != "" && vmNames[role] == vmNames["monitor"] {
				c.fail(t.lineOf("monitor"), "tap %q: monitor %s is the policy's %s: it already has that traffic", t.Name, t.Monitor, role)
				ok = false
			}
		}
		if !ok {
			continue
		}
		if t.Collector != "" {
			if byAddr {
				continue // the controller checks tenancy
			}
			if err := tappolicy.CheckCollectorTenancy(farms["sender"], farms["receiver"], t.CrossFarm, peers); err != nil {
				var fe *tappolicy.FieldError
				errors.As(err, &fe)
				c.fail(t.lineOf(fe.Field), "tap %q: %s: %s", t.Name, fe.Field, fe.Msg)
			}
			continue
		}
		if farms["monitor"] == "" {
			continue // a monitor by IP or MAC: the controller checks tenancy
		}
		if err := tappolicy.CheckTenancy(farms["sender"], farms["receiver"], farms["monitor"], t.CrossFarm, peers); err != nil {
			var fe *tappolicy.FieldError
			errors.As(err, &fe)
			c.fail(t.lineOf("monitor"), "tap %q: %s", t.Name, fe.Msg)
		}
	}
}

// collectorOnFabric checks t's collector (its syntax checked) against the
// file's fabric as the API checks it against the hosts' uplinks: an
// address of the fabric, and no host's own.
func (c *checker) collectorOnFabric(t Tap) bool {
	if !c.fabricOK {
		return true // the fabric's own error says enough
	}
	a := netip.MustParseAddr(t.Collector) // ParseSpec read it
	if !c.fabric.Contains(a) {
		c.fail(t.lineOf("collector"), "tap %q: collector: %s is not on the fabric (%s): the hosts send copies out of their uplinks, to a neighbour on the same link", t.Name, a, c.fabric)
		return false
	}
	if who := c.addrs[a]; strings.HasPrefix(who, "host ") {
		c.fail(t.lineOf("collector"), "tap %q: collector: %s is %s's own address: a collector is another machine on the fabric", t.Name, a, who)
		return false
	}
	return true
}

// Taps are the file's TAP policies, in file order.
func (f *File) Taps() []Tap { return extra[[]Tap](f, tapsKey) }
