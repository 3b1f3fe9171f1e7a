package topology

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

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
func (s Sliver) Uplinks() []int {
	var out []int
	for _, l := range s.Leases {
		if !slices.Contains(out, l.Uplink) {
			out = append(out, l.Uplink)
		}
	}
	slices.Sort(out)
	return out
}

// Intent is the sliver as the controller records it, without its slot
// (which only the controller allocates).
func (s Sliver) Intent() intent.Sliver {
	return intent.Sliver{Host: s.Host, Name: s.Name, Leases: slices.Clone(s.Leases)}
}

// The host's own ephemeral range in a fresh namespace (Linux's default
// net.ipv4.ip_local_port_range): its own connections take ports from it,
// so no sliver may lease them.
const (
	hostEphemeralLo = 32768
	hostEphemeralHi = 60999
)

// maxLeases is how many ranges one sliver may lease (portspace.MaxLeases).
const maxLeases = 16

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
		leases, err := parseLeases(s.Ports)
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
					s.Name, formatLease(l), l.Uplink, host.Name, max(host.Uplinks, 1))
				continue
			}
			if l.Lo <= hostEphemeralHi && l.Hi >= hostEphemeralLo {
				c.fail(pline, "sliver %q: lease %s overlaps host %s's own ephemeral ports %d-%d (its connections take them)",
					s.Name, formatLease(l), host.Name, hostEphemeralLo, hostEphemeralHi)
				continue
			}
			for _, o := range byHost[s.Host] {
				if o.lease.Uplink == l.Uplink && l.Lo <= o.lease.Hi && l.Hi >= o.lease.Lo {
					c.fail(pline, "sliver %q: lease %s overlaps sliver %q's lease %s on host %s (line %d)",
						s.Name, formatLease(l), o.sliver, formatLease(o.lease), host.Name, o.line)
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

// parseLeases reads a lease list, "[UPLINK:]LO-HI[,...]" ("10000-10099",
// "10000-10099,1:20000-20099"; a single port "10022" is LO=HI), as
// portspace.ParseLeases does, which the controller applies to what the API
// gets. This package stays free of the feature's kernel-facing package, so
// it reads the same syntax itself; a test holds the two to one grammar.
func parseLeases(s string) ([]intent.Lease, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("no ports: want [UPLINK:]LO-HI[,...], e.g. 10000-10099")
	}
	var out []intent.Lease
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		l, err := parseLease(part)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", part, err)
		}
		out = append(out, l)
	}
	if len(out) > maxLeases {
		return nil, fmt.Errorf("%d ranges: a sliver may lease at most %d", len(out), maxLeases)
	}
	slices.SortFunc(out, func(a, b intent.Lease) int {
		if a.Uplink != b.Uplink {
			return a.Uplink - b.Uplink
		}
		return int(a.Lo) - int(b.Lo)
	})
	for i := 1; i < len(out); i++ {
		if a, b := out[i-1], out[i]; a.Uplink == b.Uplink && b.Lo <= a.Hi {
			return nil, fmt.Errorf("ranges %s and %s overlap", formatLease(a), formatLease(b))
		}
	}
	return out, nil
}

func parseLease(s string) (intent.Lease, error) {
	var l intent.Lease
	if up, rest, ok := strings.Cut(s, ":"); ok {
		n, err := strconv.Atoi(up)
		if err != nil || n < 0 || n >= MaxUplinks {
			return l, fmt.Errorf("uplink %q: want a number 0..%d before the colon", up, MaxUplinks-1)
		}
		l.Uplink, s = n, rest
	}
	lo, hi, isRange := strings.Cut(s, "-")
	var err error
	if l.Lo, err = parsePort(lo); err != nil {
		return l, err
	}
	l.Hi = l.Lo
	if isRange {
		if l.Hi, err = parsePort(hi); err != nil {
			return l, err
		}
	}
	if l.Lo > l.Hi {
		return l, fmt.Errorf("range %d-%d runs backwards: want LO-HI with LO <= HI", l.Lo, l.Hi)
	}
	return l, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("port %q: want a number 1..65535 (syntax [UPLINK:]LO-HI)", s)
	}
	return uint16(n), nil
}

func formatLease(l intent.Lease) string {
	s := strconv.Itoa(int(l.Lo))
	if l.Hi != l.Lo {
		s += "-" + strconv.Itoa(int(l.Hi))
	}
	if l.Uplink != 0 {
		s = strconv.Itoa(l.Uplink) + ":" + s
	}
	return s
}
