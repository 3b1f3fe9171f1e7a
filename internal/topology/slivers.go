package topology

import (
	"github.com/onehop/onehop/internal/lease"
	"slices"

	"gopkg.in/yaml.v3"

	"github.com/onehop/onehop/internal/intent"
)

// Sliver is a guest that shares its host's public IPv4 and MAC and leases a
// part of its port space (port-space isolation, docs/port-space.md).
type Sliver struct {
	Name string `yaml:"name"`
	Host string `yaml:"host"`
	// Ports is the lease list as written, "[UPLINK:]LO-HI[,...]".
	Ports string `yaml:"ports"`
	// Leases are Ports read, in canonical order (by uplink, then port).
	Leases []intent.Lease `yaml:"-"`
	Line   int            `yaml:"-"`
	// Lines of the host and ports values, so an error points at the field.
	HostLine, PortsLine int `yaml:"-"`
}

// Uplinks are the uplinks the sliver leases ports on, ascending: it has an
// eth<k> for each.
func (s Sliver) Uplinks() []int { return s.Intent().Uplinks() }

// Intent is the sliver as the controller records it, without its slot
// (which only the controller allocates).
func (s Sliver) Intent() intent.Sliver {
	return intent.Sliver{Host: s.Host, Name: s.Name, Leases: slices.Clone(s.Leases)}
}

const sliversKey = "slivers"

var sliversSection = section{
	key: sliversKey,
	decode: func(d *decoder, v *yaml.Node, f *File) {
		var ss []Sliver
		d.report(d.seq("slivers", func(item *yaml.Node) {
			s := Sliver{Line: item.Line}
			d.mapping(item, "sliver", map[string]field{
				"name":  d.str(&s.Name, "sliver name"),
				"host":  at(&s.HostLine, d.str(&s.Host, "sliver host")),
				"ports": at(&s.PortsLine, d.str(&s.Ports, "sliver ports")),
			})
			ss = append(ss, s)
		})(v))
		setExtra(f, sliversKey, ss)
	},
	validate: validateSlivers,
}

func validateSlivers(c *checker, f *File) {
	ss := f.Slivers()
	// held is every lease validated so far, for the overlap check.
	type held struct {
		sliver string
		line   int
		lease  intent.Lease
	}
	byHost := map[string][]held{}
	for i := range ss {
		s := &ss[i]
		// The host-side link is s<k>-NAME: 15 bytes at most.
		if !hostNameRE.MatchString(s.Name) {
			c.fail(s.Line, "sliver name %q must be 1-12 lowercase letters or digits, starting with a letter", s.Name)
			continue
		}
		if holder, ok := c.claimNode("sliver", s.Name, s.Line); !ok {
			c.fail(s.Line, "sliver name %q is %s", s.Name, describeHolder(holder, "sliver"))
			continue
		}
		host, hostOK := f.HostByName(s.Host)
		if !hostOK || !c.isNode("host", s.Host) {
			c.fail(orLine(s.HostLine, s.Line), "sliver %q: host %q is not defined under hosts", s.Name, s.Host)
		}
		pline := orLine(s.PortsLine, s.Line)
		leases, err := lease.Parse(s.Ports)
		if err != nil {
			c.fail(pline, "sliver %q: ports %q: %v", s.Name, s.Ports, err)
			continue
		}
		s.Leases = leases
		if !hostOK {
			continue
		}
		for _, l := range leases {
			if l.Uplink >= max(host.Uplinks, 1) {
				c.fail(pline, "sliver %q: lease %s is on uplink %d, but host %s has %d uplink(s) (uplinks: N on the host adds more)",
					s.Name, lease.FormatOne(l), l.Uplink, host.Name, max(host.Uplinks, 1))
				continue
			}
			if l.Lo <= lease.DefaultEphemeralHi && l.Hi >= lease.DefaultEphemeralLo {
				c.fail(pline, "sliver %q: lease %s overlaps host %s's own ephemeral ports %d-%d (its connections take them)",
					s.Name, lease.FormatOne(l), host.Name, lease.DefaultEphemeralLo, lease.DefaultEphemeralHi)
				continue
			}
			for _, o := range byHost[s.Host] {
				if o.lease.Uplink == l.Uplink && l.Lo <= o.lease.Hi && l.Hi >= o.lease.Lo {
					c.fail(pline, "sliver %q: lease %s overlaps sliver %q's lease %s on host %s (line %d)",
						s.Name, lease.FormatOne(l), o.sliver, lease.FormatOne(o.lease), host.Name, o.line)
				}
			}
		}
		for _, l := range leases {
			byHost[s.Host] = append(byHost[s.Host], held{s.Name, pline, l})
		}
	}
}

// Slivers are the lab's slivers, in file order.
func (f *File) Slivers() []Sliver { return extra[[]Sliver](f, sliversKey) }

// SliverByName returns the sliver named name.
func (f *File) SliverByName(name string) (Sliver, bool) {
	for _, s := range f.Slivers() {
		if s.Name == name {
			return s, true
		}
	}
	return Sliver{}, false
}
