package topology

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"

	"gopkg.in/yaml.v3"
)

// WAN is one wide-area path between an access gateway and a data center's
// tunnel router (issue 11, multipath cloud access): a router namespace
// with one link to the gateway and one to the xTR, each shaped to Rate.
// Its CIDR is split in two: the gateway's side is the lower half (router
// .1, gateway .2), the xTR's the upper half (router +1, xTR +2).
type WAN struct {
	Name string `yaml:"name"`
	// Rate shapes both directions (tc's syntax: 100mbit, 1gbit, 500kbit);
	// "" leaves the path unshaped.
	Rate string `yaml:"rate"`
	// CIDR holds the path's two links; default 172.31.N.0/24 for the N-th
	// WAN (from 1).
	CIDR string `yaml:"cidr"`
	Line int    `yaml:"-"`
}

const wansKey = "wans"

// rateRE is what tc accepts as a rate, in the units a topology may use.
var rateRE = regexp.MustCompile(`^([1-9][0-9]{0,9})(bit|kbit|mbit|gbit)$`)

// RateBits returns the WAN's rate in bits per second; 0 when unshaped.
func (w WAN) RateBits() uint64 {
	m := rateRE.FindStringSubmatch(w.Rate)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseUint(m[1], 10, 64)
	return n * map[string]uint64{"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m[2]]
}

// Prefix is the WAN's CIDR; valid after Parse.
func (w WAN) Prefix() netip.Prefix { return netip.MustParsePrefix(w.CIDR) }

// half returns the gateway's (0) or the xTR's (1) side of the WAN.
func (w WAN) half(side int) netip.Prefix {
	p := w.Prefix()
	return netip.PrefixFrom(nthAddr(p, side<<(31-p.Bits())), p.Bits()+1)
}

// GatewaySide is the gateway's link of the WAN.
func (w WAN) GatewaySide() netip.Prefix { return w.half(0) }

// XTRSide is the xTR's link of the WAN.
func (w WAN) XTRSide() netip.Prefix { return w.half(1) }

// SideRouter and SideNode are the router's and the attached node's
// addresses on side (GatewaySide or XTRSide).
func SideRouter(side netip.Prefix) netip.Addr { return nthAddr(side, 1) }

// SideNode: see SideRouter.
func SideNode(side netip.Prefix) netip.Addr { return nthAddr(side, 2) }

var wansSection = section{
	key: wansKey,
	decode: func(d *decoder, v *yaml.Node, f *File) {
		var ws []WAN
		d.report(d.seq("wans", func(item *yaml.Node) {
			w := WAN{Line: item.Line}
			d.mapping(item, "wan", map[string]field{
				"name": d.str(&w.Name, "wan name"),
				"rate": d.str(&w.Rate, "wan rate"),
				"cidr": d.str(&w.CIDR, "wan cidr"),
			})
			ws = append(ws, w)
		})(v))
		setExtra(f, wansKey, ws)
	},
	validate: func(c *checker, f *File) {
		ws := f.WANs()
		if len(ws) > 8 {
			c.fail(ws[8].Line, "%d wans: at most 8 (an MPTCP connection has at most 8 subflows)", len(ws))
		}
		for i := range ws {
			w := &ws[i]
			// The name is the router's namespace and, on the gateway
			// and the xTR, the interface towards it.
			if !hostNameRE.MatchString(w.Name) || w.Name == "mgmt0" {
				c.fail(w.Line, "wan name %q must be 1-12 lowercase letters or digits, starting with a letter (and not mgmt0)", w.Name)
				continue
			}
			if holder, ok := c.claimNode("wan", w.Name, w.Line); !ok {
				c.fail(w.Line, "wan name %q is %s", w.Name, describeHolder(holder, "wan"))
				continue
			}
			if w.Rate != "" && !rateRE.MatchString(w.Rate) {
				c.fail(w.Line, "wan %s: rate %q must be a number and a unit, bit, kbit, mbit or gbit (like 100mbit)", w.Name, w.Rate)
			}
			if w.CIDR == "" {
				w.CIDR = fmt.Sprintf("172.31.%d.0/24", i+1)
			}
			p, err := netip.ParsePrefix(w.CIDR)
			if err != nil || !p.Addr().Is4() || p.Bits() > 29 || p.Masked() != p {
				c.fail(w.Line, "wan %s: cidr %q must be an IPv4 network of /29 or wider (no host bits)", w.Name, w.CIDR)
				w.CIDR = ""
				continue
			}
			if c.fabricOK && p.Overlaps(c.fabric) {
				c.fail(w.Line, "wan %s: cidr %s overlaps the fabric %s", w.Name, p, c.fabric)
			}
			c.claimPrefix(w.Line, "wan "+w.Name, p)
		}
	},
}

// WANs are the lab's wide-area paths, in file order.
func (f *File) WANs() []WAN { return extra[[]WAN](f, wansKey) }

// WANByName returns the WAN named name.
func (f *File) WANByName(name string) (WAN, bool) {
	for _, w := range f.WANs() {
		if w.Name == name {
			return w, true
		}
	}
	return WAN{}, false
}

// names reads a list of names (a YAML sequence of scalars).
func (d *decoder) names(dst *[]string, what string) field {
	return func(v *yaml.Node) error {
		if v.Kind != yaml.SequenceNode {
			return d.fail(v, "%s must be a list of names", what)
		}
		for _, n := range v.Content {
			if n.Kind != yaml.ScalarNode {
				return d.fail(n, "%s must be a list of names", what)
			}
			*dst = append(*dst, n.Value)
		}
		return nil
	}
}

// claimPrefix records that who uses the network p (the WANs' links, the
// gateways' and xTRs' EID prefixes, the gateways' user links), refusing
// one that overlaps another's.
func (c *checker) claimPrefix(line int, who string, p netip.Prefix) {
	if c.prefixes == nil {
		c.prefixes = map[netip.Prefix]string{}
	}
	for q, other := range c.prefixes {
		if q.Overlaps(p) {
			c.fail(line, "%s: %s overlaps %s's %s", who, p, other, q)
			return
		}
	}
	c.prefixes[p] = who
}
