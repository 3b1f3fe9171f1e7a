package topology

import (
	"fmt"
	"net/netip"

	"gopkg.in/yaml.v3"
)

// XTR is a data center's LISP tunnel router (issue 11, `onehop xtr run`):
// a namespace on the fabric (to register with the map-server) with one link
// to each of its WANs (an RLOC each) and one to each of its servers, which
// live in its EID prefix.
type XTR struct {
	Name string `yaml:"name"`
	// Address is its fabric address; allocated when not given.
	Address string `yaml:"address"`
	// EIDPrefix is the data center's EID prefix; the xTR holds its first
	// address, servers the ones after. Default 10.88.N.0/24.
	EIDPrefix string `yaml:"eid-prefix"`
	// WANs are the paths it is reached by, in order; default every WAN.
	WANs []string `yaml:"wans"`
	// Servers sit behind it in the EID prefix.
	Servers []Server `yaml:"servers"`
	Line    int      `yaml:"-"`
}

// Server is a machine in a data center's EID prefix, behind its xTR: a
// namespace with one link (eth0) and a default route through the xTR.
type Server struct {
	Name string `yaml:"name"`
	// Address is its EID; default the prefix's address 10+k for the k-th.
	Address string `yaml:"address"`
	// MPTCP (default true) lets the server take MPTCP subflows (the
	// namespace's MPTCP limits raised); false leaves MPTCP off
	// (net.mptcp.enabled=0), a server the gateway must fall back to TCP for.
	MPTCP *bool `yaml:"mptcp"`
	Line  int   `yaml:"-"`
}

const xtrsKey = "xtrs"

// XTRAddr is the xTR's own address in its EID prefix (its servers' gateway).
func (x XTR) XTRAddr() netip.Addr { return nthAddr(netip.MustParsePrefix(x.EIDPrefix), 1) }

// TakesMPTCP reports whether the server takes MPTCP.
func (s Server) TakesMPTCP() bool { return s.MPTCP == nil || *s.MPTCP }

var xtrsSection = section{
	key: xtrsKey,
	decode: func(d *decoder, v *yaml.Node, f *File) {
		var xs []XTR
		d.report(d.seq("xtrs", func(item *yaml.Node) {
			x := XTR{Line: item.Line}
			d.mapping(item, "xtr", map[string]field{
				"name":       d.str(&x.Name, "xtr name"),
				"address":    d.str(&x.Address, "xtr address"),
				"eid-prefix": d.str(&x.EIDPrefix, "xtr eid-prefix"),
				"wans":       d.names(&x.WANs, "xtr wans"),
				"servers": d.seq("xtr servers", func(sn *yaml.Node) {
					s := Server{Line: sn.Line}
					var mptcp bool
					d.mapping(sn, "server", map[string]field{
						"name":    d.str(&s.Name, "server name"),
						"address": d.str(&s.Address, "server address"),
						"mptcp": func(v *yaml.Node) error {
							err := d.flag(&mptcp, "server mptcp")(v)
							s.MPTCP = &mptcp
							return err
						},
					})
					x.Servers = append(x.Servers, s)
				}),
			})
			xs = append(xs, x)
		})(v))
		setExtra(f, xtrsKey, xs)
	},
	validate: func(c *checker, f *File) {
		xs := f.XTRs()
		for i := range xs {
			if xs[i].Address != "" {
				c.fabricAddr(xs[i].Line, "xtr "+xs[i].Name, xs[i].Address)
			}
		}
		for i := range xs {
			x := &xs[i]
			if !cloudNode(c, "xtr", x.Name, x.Line) {
				continue
			}
			if x.Address == "" {
				x.Address = c.allocate(x.Line, "xtr "+x.Name, 10+len(f.Hosts))
			}
			x.WANs = attachWANs(c, f, "xtr", x.Name, x.Line, x.WANs)
			x.EIDPrefix = cloudPrefix(c, x.Line, "xtr "+x.Name+" eid-prefix", x.EIDPrefix, fmt.Sprintf("10.88.%d.0/24", i), 28)
			p := netip.MustParsePrefix(x.EIDPrefix)
			used := map[netip.Addr]string{x.XTRAddr(): "the xtr itself"}
			for k := range x.Servers {
				s := &x.Servers[k]
				if !cloudNode(c, "server", s.Name, s.Line) {
					continue
				}
				if s.Address == "" {
					s.Address = nthAddr(p, 10+k).String()
				}
				a, err := netip.ParseAddr(s.Address)
				switch {
				case err != nil || !a.Is4():
					c.fail(s.Line, "server %s: address %q is not an IPv4 address", s.Name, s.Address)
				case !p.Contains(a) || a == p.Addr() || a == lastAddr(p):
					c.fail(s.Line, "server %s: address %s is not a usable address of its xtr's eid-prefix %s", s.Name, a, p)
				case used[a] != "":
					c.fail(s.Line, "server %s: address %s is already %s", s.Name, a, used[a])
				default:
					used[a] = "server " + s.Name + "'s"
				}
			}
		}
		// Every WAN joins one gateway to one xTR: a WAN with an end
		// missing would be a path nothing uses.
		if len(f.Gateways())+len(xs) == 0 {
			return
		}
		for _, w := range f.WANs() {
			for _, kind := range []string{"gateway", "xtr"} {
				if _, ok := c.wanEnds[kind+"/"+w.Name]; !ok && c.isNode("wan", w.Name) {
					c.fail(w.Line, "wan %s joins no %s (list it in a %s's wans:)", w.Name, kind, kind)
				}
			}
		}
	},
}

// XTRs are the lab's tunnel routers, in file order.
func (f *File) XTRs() []XTR { return extra[[]XTR](f, xtrsKey) }

// XTRByName returns the xTR named name.
func (f *File) XTRByName(name string) (XTR, bool) {
	for _, x := range f.XTRs() {
		if x.Name == name {
			return x, true
		}
	}
	return XTR{}, false
}

// ServerByName returns the server named name and its xTR.
func (f *File) ServerByName(name string) (Server, XTR, bool) {
	for _, x := range f.XTRs() {
		for _, s := range x.Servers {
			if s.Name == name {
				return s, x, true
			}
		}
	}
	return Server{}, XTR{}, false
}

// CloudAccess reports whether the lab has cloud-access nodes (and so needs
// the controller's map-server).
func (f *File) CloudAccess() bool { return len(f.Gateways())+len(f.XTRs()) > 0 }
