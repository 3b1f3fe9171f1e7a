package topology

import (
	"github.com/onehop/onehop/internal/egressspec"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Farm is one tenant's network.
type Farm struct {
	Name    string   `yaml:"name"`
	Subnets []Subnet `yaml:"subnets"`
	Rules   []Rule   `yaml:"rules"`
	Peers   []string `yaml:"peers"` // farms this farm agrees to talk to
	// ProxyARP: the datapath answers a VM's ARP for another subnet with
	// the gateway's MAC.
	ProxyARP bool `yaml:"proxy_arp"`
	// Egress, when set, lets the farm's VMs reach outside the tenant space
	// through their hosts' addresses (docs/north-south.md).
	Egress *egressspec.Setting `yaml:"-"`
	Line   int                 `yaml:"-"`
}

// Rule lets traffic from one subnet reach another: "web" names a subnet of
// the farm, "red/web" one of another farm (which must peer and allow it too).
type Rule struct {
	From  string `yaml:"from"`
	To    string `yaml:"to"`
	Proto string `yaml:"proto"` // tcp, udp, icmp or any (default)
	Port  uint16 `yaml:"port"`  // tcp/udp destination port; 0 or absent is any
	Line  int    `yaml:"-"`
}

// Qualify turns a rule's subnet reference into farm/subnet.
func (f Farm) Qualify(ref string) string {
	if strings.Contains(ref, "/") {
		return ref
	}
	return f.Name + "/" + ref
}

// Subnet is one subnet of a farm (a /24 in the default plan).
type Subnet struct {
	Name string `yaml:"name"`
	Line int    `yaml:"-"`
	// Egress, when set, is the subnet's own egress setting, which
	// overrides its farm's: `egress: false` (off there), or a mapping as
	// a farm's (on there).
	Egress *egressspec.Setting `yaml:"-"`
}

var farmsSection = section{
	key: "farms",
	decode: func(d *decoder, v *yaml.Node, f *File) {
		d.report(d.seq("farms", func(item *yaml.Node) {
			f.Farms = append(f.Farms, decodeFarm(d, item))
		})(v))
	},
	validate: validateFarms,
}

func decodeFarm(d *decoder, item *yaml.Node) Farm {
	fm := Farm{Line: item.Line}
	d.mapping(item, "farm", map[string]field{
		"name": d.str(&fm.Name, "farm name"),
		"subnets": d.seq("subnets", func(sn *yaml.Node) {
			s := Subnet{Line: sn.Line}
			d.mapping(sn, "subnet", map[string]field{
				"name":   d.str(&s.Name, "subnet name"),
				"egress": d.egress(&s.Egress, "subnet egress", true),
			})
			fm.Subnets = append(fm.Subnets, s)
		}),
		"proxy_arp": d.flag(&fm.ProxyARP, "farm proxy_arp"),
		"egress":    d.egress(&fm.Egress, "farm egress", false),
		"peers": d.seq("peers", func(p *yaml.Node) {
			var name string
			if err := d.str(&name, "peer")(p); err != nil {
				d.report(err)
				return
			}
			fm.Peers = append(fm.Peers, name)
		}),
		"rules": d.seq("rules", func(rn *yaml.Node) {
			r := Rule{Line: rn.Line}
			var port string
			d.mapping(rn, "rule", map[string]field{
				"from":  d.str(&r.From, "rule from"),
				"to":    d.str(&r.To, "rule to"),
				"proto": d.str(&r.Proto, "rule proto"),
				"port":  d.str(&port, "rule port"),
			})
			if port != "" {
				n, err := strconv.ParseUint(port, 10, 16)
				if err != nil || n == 0 {
					d.report(d.fail(rn, "rule port %q is not a port number 1-65535", port))
				}
				r.Port = uint16(n)
			}
			fm.Rules = append(fm.Rules, r)
		}),
	})
	return fm
}

func validateFarms(c *checker, f *File) {
	for _, fm := range f.Farms {
		if !nameRE.MatchString(fm.Name) {
			c.fail(fm.Line, "farm name %q must be lowercase letters, digits or '-', starting with a letter", fm.Name)
			continue
		}
		if c.farms[fm.Name] {
			c.fail(fm.Line, "duplicate farm %q", fm.Name)
			continue
		}
		c.farms[fm.Name] = true
		if len(fm.Subnets) == 0 {
			c.fail(fm.Line, "farm %q has no subnets", fm.Name)
		}
		if n := c.plan.MaxSubnets(); len(fm.Subnets) > n {
			c.fail(fm.Line, "farm %q has %d subnets; at most %d fit in the address plan %v", fm.Name, len(fm.Subnets), n, c.plan)
		}
		for _, s := range fm.Subnets {
			key := fm.Name + "/" + s.Name
			switch {
			case !nameRE.MatchString(s.Name):
				c.fail(s.Line, "subnet name %q must be lowercase letters, digits or '-', starting with a letter", s.Name)
			case c.subnets[key]:
				c.fail(s.Line, "duplicate subnet %q", key)
			default:
				c.subnets[key] = true
			}
		}
	}
	if n := c.plan.MaxFarms(); len(f.Farms) > n {
		c.fail(f.Line, "%d farms; at most %d fit in the address plan %v", len(f.Farms), n, c.plan)
	}

	for _, fm := range f.Farms {
		for _, p := range fm.Peers {
			if !c.farms[p] || p == fm.Name {
				c.fail(fm.Line, "farm %q peers with %q, which is not another farm of this file", fm.Name, p)
			}
		}
		for _, r := range fm.Rules {
			from, to := fm.Qualify(r.From), fm.Qualify(r.To)
			switch {
			case !c.subnets[from]:
				c.fail(r.Line, "rule of farm %q: from %q is not a subnet (write web, or farm/subnet)", fm.Name, r.From)
			case !c.subnets[to]:
				c.fail(r.Line, "rule of farm %q: to %q is not a subnet (write web, or farm/subnet)", fm.Name, r.To)
			case from == to:
				c.fail(r.Line, "rule of farm %q: from and to are the same subnet, which is always open", fm.Name)
			case !strings.HasPrefix(from, fm.Name+"/") && !strings.HasPrefix(to, fm.Name+"/"):
				c.fail(r.Line, "rule of farm %q: neither %s nor %s belongs to it", fm.Name, from, to)
			}
			switch strings.ToLower(r.Proto) {
			case "", "any", "icmp":
				if r.Port != 0 {
					c.fail(r.Line, "rule of farm %q: a port needs proto tcp or udp", fm.Name)
				}
			case "tcp", "udp":
			default:
				c.fail(r.Line, "rule of farm %q: proto %q is not tcp, udp, icmp or any", fm.Name, r.Proto)
			}
		}
	}
}

// egress reads an egress setting: a mapping of to and slice, which turns
// it on; for a subnet also false, which turns it off there.
func (d *decoder) egress(dst **egressspec.Setting, what string, offToo bool) field {
	return func(v *yaml.Node) error {
		if offToo && v.Kind == yaml.ScalarNode {
			if v.Value != "false" {
				return d.fail(v, "%s must be false (off here, whatever the farm's) or a mapping of to and slice (on)", what)
			}
			*dst = &egressspec.Setting{}
			return nil
		}
		var to, slice string
		d.mapping(v, what, map[string]field{
			"to":    d.str(&to, "egress to"),
			"slice": d.str(&slice, "egress slice"),
		})
		s := egressspec.Setting{Enabled: true}
		if to != "" {
			list, err := egressspec.ParseTo(to)
			if err != nil {
				return d.fail(v, "%s to: %v", what, err)
			}
			s.To = list
		}
		if slice != "" {
			n, err := strconv.Atoi(slice)
			if err != nil {
				return d.fail(v, "%s slice %q is not a number", what, slice)
			}
			s.Slice = n
		}
		if _, err := egressspec.Farm(s); err != nil {
			return d.fail(v, "%s: %v", what, err)
		}
		*dst = &s
		return nil
	}
}
