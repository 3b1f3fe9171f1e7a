package topology

import (
	"fmt"
	"net/netip"

	"gopkg.in/yaml.v3"
)

// Gateway is a multipath cloud-access gateway (issue 11, `onehop gateway
// run`): a namespace on the fabric (to reach the map-server) with a link to
// each of its WANs and one to each of its users, whose plain TCP it takes
// over and carries to the data center as MPTCP, one subflow per WAN.
type Gateway struct {
	Name string `yaml:"name"`
	// Address is its fabric address; allocated when not given.
	Address string `yaml:"address"`
	// EIDPrefix is its EID prefix; path i's EID is the prefix's address
	// i+1. Default 10.77.N.0/24 for the N-th gateway (from 0).
	EIDPrefix string `yaml:"eid-prefix"`
	// WANs are the paths it uses, in order; default every WAN.
	WANs []string `yaml:"wans"`
	// UsersCIDR holds its users' links, a /30 each (gateway .1, user .2);
	// default 10.76.N.0/24.
	UsersCIDR string `yaml:"users-cidr"`
	// Users are the plain TCP clients behind it.
	Users []User `yaml:"users"`
	Line  int    `yaml:"-"`
}

// User is a plain TCP client behind a gateway: a namespace with one link
// (eth0) to its gateway and a default route through it. It runs nothing
// and knows nothing of MPTCP or LISP.
type User struct {
	Name string `yaml:"name"`
	Line int    `yaml:"-"`
}

const gatewaysKey = "gateways"

// PathEID is the gateway's EID for its path i (its i-th WAN).
func (g Gateway) PathEID(i int) netip.Addr {
	return nthAddr(netip.MustParsePrefix(g.EIDPrefix), i+1)
}

// UserLink is user k's link: the gateway's address and the user's, /30.
func (g Gateway) UserLink(k int) (gw, user netip.Prefix) {
	p := netip.MustParsePrefix(g.UsersCIDR)
	return netip.PrefixFrom(nthAddr(p, 4*k+1), 30), netip.PrefixFrom(nthAddr(p, 4*k+2), 30)
}

var gatewaysSection = section{
	key: gatewaysKey,
	decode: func(d *decoder, v *yaml.Node, f *File) {
		var gs []Gateway
		d.report(d.seq("gateways", func(item *yaml.Node) {
			g := Gateway{Line: item.Line}
			d.mapping(item, "gateway", map[string]field{
				"name":       d.str(&g.Name, "gateway name"),
				"address":    d.str(&g.Address, "gateway address"),
				"eid-prefix": d.str(&g.EIDPrefix, "gateway eid-prefix"),
				"wans":       d.names(&g.WANs, "gateway wans"),
				"users-cidr": d.str(&g.UsersCIDR, "gateway users-cidr"),
				"users": d.seq("gateway users", func(u *yaml.Node) {
					us := User{Line: u.Line}
					d.mapping(u, "user", map[string]field{"name": d.str(&us.Name, "user name")})
					g.Users = append(g.Users, us)
				}),
			})
			gs = append(gs, g)
		})(v))
		setExtra(f, gatewaysKey, gs)
	},
	validate: func(c *checker, f *File) {
		gs := f.Gateways()
		for i := range gs {
			g := &gs[i]
			if g.Address != "" {
				c.fabricAddr(g.Line, "gateway "+g.Name, g.Address)
			}
		}
		for i := range gs {
			g := &gs[i]
			if !cloudNode(c, "gateway", g.Name, g.Line) {
				continue
			}
			if g.Address == "" {
				g.Address = c.allocate(g.Line, "gateway "+g.Name, 10+len(f.Hosts))
			}
			g.WANs = attachWANs(c, f, "gateway", g.Name, g.Line, g.WANs)
			g.EIDPrefix = cloudPrefix(c, g.Line, "gateway "+g.Name+" eid-prefix", g.EIDPrefix, fmt.Sprintf("10.77.%d.0/24", i), 30)
			g.UsersCIDR = cloudPrefix(c, g.Line, "gateway "+g.Name+" users-cidr", g.UsersCIDR, fmt.Sprintf("10.76.%d.0/24", i), 30)
			if len(g.Users) == 0 {
				c.fail(g.Line, "gateway %s has no users: its users: list names the plain TCP clients behind it", g.Name)
			}
			if p, err := netip.ParsePrefix(g.UsersCIDR); err == nil && len(g.Users) > 1<<(32-p.Bits())/4 {
				c.fail(g.Line, "gateway %s: %d users do not fit users-cidr %s (a /30 each)", g.Name, len(g.Users), p)
			}
			for _, u := range g.Users {
				cloudNode(c, "user", u.Name, u.Line)
			}
		}
	},
}

// Gateways are the lab's access gateways, in file order.
func (f *File) Gateways() []Gateway { return extra[[]Gateway](f, gatewaysKey) }

// GatewayByName returns the gateway named name.
func (f *File) GatewayByName(name string) (Gateway, bool) {
	for _, g := range f.Gateways() {
		if g.Name == name {
			return g, true
		}
	}
	return Gateway{}, false
}

// UserByName returns the user named name, its gateway and its index there.
func (f *File) UserByName(name string) (User, Gateway, int, bool) {
	for _, g := range f.Gateways() {
		for k, u := range g.Users {
			if u.Name == name {
				return u, g, k, true
			}
		}
	}
	return User{}, Gateway{}, 0, false
}

// cloudNode checks and claims the name of a cloud-access node: it names a
// namespace and (u-NAME, s-NAME, p-NAME) interfaces, 15 bytes at most.
func cloudNode(c *checker, kind, name string, line int) bool {
	if !hostNameRE.MatchString(name) {
		c.fail(line, "%s name %q must be 1-12 lowercase letters or digits, starting with a letter", kind, name)
		return false
	}
	if holder, ok := c.claimNode(kind, name, line); !ok {
		c.fail(line, "%s name %q is %s", kind, name, describeHolder(holder, kind))
		return false
	}
	return true
}

// attachWANs checks that a gateway's or an xTR's wans name WANs, once
// each, and that no other node of its kind has taken them (a WAN joins one
// gateway to one xTR); none given means every WAN.
func attachWANs(c *checker, f *File, kind, name string, line int, wans []string) []string {
	if len(wans) == 0 {
		for _, w := range f.WANs() {
			wans = append(wans, w.Name)
		}
	}
	if len(wans) == 0 {
		c.fail(line, "%s %s has no wans: a wans: section must list its paths", kind, name)
	}
	if c.wanEnds == nil {
		c.wanEnds = map[string]string{}
	}
	for _, w := range wans {
		if !c.isNode("wan", w) {
			c.fail(line, "%s %s: wan %q is not defined under wans:", kind, name, w)
			continue
		}
		k := kind + "/" + w
		if other, taken := c.wanEnds[k]; taken {
			c.fail(line, "%s %s: wan %s already joins %s %s (a wan joins one gateway to one xtr)", kind, name, w, kind, other)
			continue
		}
		c.wanEnds[k] = name
	}
	return wans
}

// cloudPrefix checks (or defaults) an IPv4 network of at most maxBits bits
// and claims it.
func cloudPrefix(c *checker, line int, who, s, def string, maxBits int) string {
	if s == "" {
		s = def
	}
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is4() || p.Bits() > maxBits || p.Masked() != p {
		c.fail(line, "%s %q must be an IPv4 network of /%d or wider (no host bits)", who, s, maxBits)
		return netip.MustParsePrefix(def).String()
	}
	if c.fabricOK && p.Overlaps(c.fabric) {
		c.fail(line, "%s %s overlaps the fabric %s", who, p, c.fabric)
	}
	c.claimPrefix(line, who, p)
	return p.String()
}
