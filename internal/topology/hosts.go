package topology

import (
	"github.com/onehop/onehop/internal/lease"
	"regexp"
	"strconv"

	"gopkg.in/yaml.v3"
)

// Host is one physical server.
type Host struct {
	Name    string `yaml:"name"`
	Address string `yaml:"address"` // uplink 0's address
	// Uplinks is how many links the host has to the fabric, 1..MaxUplinks
	// (multi-homing, paper 000 §3.3d); each has its own address.
	Uplinks int `yaml:"uplinks"`
	// UplinkAddrs are the uplinks' addresses by index; UplinkAddrs[0] is
	// Address. The others are allocated after every other fabric address
	// (uplinksSection), so adding an uplink moves no one else's.
	UplinkAddrs []string `yaml:"-"`
	Line        int      `yaml:"-"`
}

// MaxUplinks is how many uplinks a host may have.
const MaxUplinks = lease.MaxUplinks

// UplinkName is the name of a host's uplink k in its namespace: uplink0,
// uplink1, ...
func UplinkName(k int) string { return "uplink" + strconv.Itoa(k) }

// Host and VM names become parts of interface names (p-HOST in the fabric,
// vif-VM on the host), which Linux caps at 15 bytes.
var hostNameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,11}$`)

var hostsSection = section{
	key: "hosts",
	decode: func(d *decoder, v *yaml.Node, f *File) {
		d.report(d.seq("hosts", func(item *yaml.Node) {
			h := Host{Line: item.Line}
			d.mapping(item, "host", map[string]field{
				"name":    d.str(&h.Name, "host name"),
				"address": d.str(&h.Address, "host address"),
				"uplinks": d.integer(&h.Uplinks, "host uplinks", 1, MaxUplinks),
			})
			f.Hosts = append(f.Hosts, h)
		})(v))
	},
	validate: func(c *checker, f *File) {
		if len(f.Hosts) == 0 && !f.CloudAccess() { // a cloud-access lab may have none
			c.fail(f.Line, "no hosts: a lab needs at least one host under hosts:")
		}
		for i := range f.Hosts {
			h := &f.Hosts[i]
			if !hostNameRE.MatchString(h.Name) {
				c.fail(h.Line, "host name %q must be 1-12 lowercase letters or digits, starting with a letter", h.Name)
				continue
			}
			if h.Name == etcdRoot {
				c.fail(h.Line, "%v", errEtcdRoot)
				continue
			}
			if h.Uplinks == 0 {
				h.Uplinks = 1
			}
			if holder, ok := c.claimNode("host", h.Name, h.Line); !ok {
				switch holder.kind {
				case "":
					c.fail(h.Line, "host name %q is reserved", h.Name)
				case "host":
					c.fail(h.Line, "duplicate host %q (first defined on line %d)", h.Name, holder.line)
				default:
					c.fail(h.Line, "host name %q is already the %s defined on line %d", h.Name, holder.kind, holder.line)
				}
				continue
			}
			if h.Address == "" && c.fabricOK {
				h.Address = nthAddr(c.fabric, 10+i).String()
			}
			if h.Address != "" {
				c.fabricAddr(h.Line, "host "+h.Name, h.Address)
			}
		}
	},
}

// HostByName returns the host named name.
func (f *File) HostByName(name string) (Host, bool) {
	for _, h := range f.Hosts {
		if h.Name == name {
			return h, true
		}
	}
	return Host{}, false
}
