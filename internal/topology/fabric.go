package topology

import (
	"net/netip"
	"strconv"
	"time"

	"gopkg.in/yaml.v3"
)

// Fabric is the flat L2 underlay every host's uplink joins.
type Fabric struct {
	CIDR       string `yaml:"cidr"`
	Controller string `yaml:"controller"`
	Line       int    `yaml:"-"`
}

// ARP tunes every agent's ARP engine; zero values keep the agent's defaults.
type ARP struct {
	TableSize int           `yaml:"table_size"` // mapping-table entries per host
	Refresh   time.Duration `yaml:"refresh"`    // confirm entries in use this often
	Idle      time.Duration `yaml:"idle"`       // forget entries unused this long
	Line      int           `yaml:"-"`
}

// AgentArgs are the agent flags that carry these settings.
func (a ARP) AgentArgs() []string {
	var args []string
	if a.TableSize != 0 {
		args = append(args, "--mapping-table-size", strconv.Itoa(a.TableSize))
	}
	if a.Refresh != 0 {
		args = append(args, "--arp-refresh", a.Refresh.String())
	}
	if a.Idle != 0 {
		args = append(args, "--arp-idle", a.Idle.String())
	}
	return args
}

var fabricSection = section{
	key: "fabric",
	decode: func(d *decoder, v *yaml.Node, f *File) {
		f.Fabric.Line = v.Line
		d.mapping(v, "fabric", map[string]field{
			"cidr":       d.str(&f.Fabric.CIDR, "fabric.cidr"),
			"controller": d.str(&f.Fabric.Controller, "fabric.controller"),
		})
	},
	validate: func(c *checker, f *File) {
		line := orLine(f.Fabric.Line, f.Line)
		if f.Fabric.CIDR == "" {
			f.Fabric.CIDR = "192.168.100.0/24"
		}
		fabric, err := netip.ParsePrefix(f.Fabric.CIDR)
		c.fabricOK = err == nil && fabric.Addr().Is4() && fabric.Bits() >= 8 && fabric.Bits() <= 28 && !fabric.Overlaps(c.plan.Prefix)
		switch {
		case err != nil:
			c.fail(line, "fabric.cidr %q is not a CIDR: %v", f.Fabric.CIDR, err)
		case !c.fabricOK:
			c.fail(line, "fabric.cidr %s must be IPv4 with a prefix of /8 to /28 outside the tenant space %s", fabric, c.plan.Prefix)
		}
		c.fabric = fabric.Masked()
		if f.Fabric.Controller == "" && c.fabricOK {
			f.Fabric.Controller = c.fabric.Addr().Next().String()
		}
		if f.Fabric.Controller != "" {
			c.fabricAddr(line, "controller", f.Fabric.Controller)
		}
	},
}

var arpSection = section{
	key: "arp",
	decode: func(d *decoder, v *yaml.Node, f *File) {
		f.ARP.Line = v.Line
		d.mapping(v, "arp", map[string]field{
			"table_size": d.integer(&f.ARP.TableSize, "arp.table_size", 64, 1<<20),
			"refresh":    d.duration(&f.ARP.Refresh, "arp.refresh"),
			"idle":       d.duration(&f.ARP.Idle, "arp.idle"),
		})
	},
	validate: func(*checker, *File) {}, // each value was checked as it was read
}
