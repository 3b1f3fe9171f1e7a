package topology

import (
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/policy"
)

// VM is one guest, placed on a host, in farm/subnet.
type VM struct {
	Name   string `yaml:"name"`
	Host   string `yaml:"host"`
	Subnet string `yaml:"subnet"`
	// DHCP leaves the VM's interface without an address: the VM asks for it
	// (onehop answers on the VM's host).
	DHCP bool `yaml:"dhcp"`
	// VNAT makes the VM an endpoint whose connections survive a change of
	// its address (issue 10): the lab runs the VNAT daemon in it.
	VNAT bool `yaml:"vnat"`
	// Interface names the host interface that carries the guest, as
	// `vm create --interface` does; "" is the default (Vif).
	Interface string `yaml:"interface"`
	// Firewall is the VM's own firewall, if it has one.
	Firewall *intent.Firewall `yaml:"-"`
	Line     int              `yaml:"-"`
	// Lines of the host, subnet and interface values, so an error points
	// at the field.
	HostLine, SubnetLine, InterfaceLine int `yaml:"-"`
}

// Vif is the host interface that carries the VM: its Interface, else the
// default, derived from its farm and name (intent.VifName).
func (v VM) Vif() string {
	if v.Interface != "" {
		return v.Interface
	}
	return intent.VifName(v.Farm(), v.Name)
}

// Farm returns the farm part of the VM's "farm/subnet".
func (v VM) Farm() string { f, _, _ := strings.Cut(v.Subnet, "/"); return f }

// SubnetName returns the subnet part of the VM's "farm/subnet".
func (v VM) SubnetName() string { _, s, _ := strings.Cut(v.Subnet, "/"); return s }

// A VM's name is a lab node's, and its namespace's (oh-LAB-NAME), and it
// begins its default vif's (intent.VifName).
var vmNameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,10}$`)

var vmsSection = section{
	key: "vms",
	decode: func(d *decoder, v *yaml.Node, f *File) {
		d.report(d.seq("vms", func(item *yaml.Node) {
			f.VMs = append(f.VMs, decodeVM(d, item))
		})(v))
	},
	validate: validateVMs,
}

func decodeVM(d *decoder, item *yaml.Node) VM {
	vm := VM{Line: item.Line}
	d.mapping(item, "vm", map[string]field{
		"name":      d.str(&vm.Name, "vm name"),
		"host":      at(&vm.HostLine, d.str(&vm.Host, "vm host")),
		"subnet":    at(&vm.SubnetLine, d.str(&vm.Subnet, "vm subnet")),
		"interface": at(&vm.InterfaceLine, d.str(&vm.Interface, "vm interface")),
		"firewall": func(v *yaml.Node) error {
			fw := &intent.Firewall{DefaultIn: "allow", DefaultOut: "allow"}
			d.mapping(v, "firewall", map[string]field{
				"default_in":  d.str(&fw.DefaultIn, "firewall default_in"),
				"default_out": d.str(&fw.DefaultOut, "firewall default_out"),
				"rules": d.seq("firewall rules", func(rn *yaml.Node) {
					var r intent.FirewallRule
					var ports string
					d.mapping(rn, "firewall rule", map[string]field{
						"dir":    d.str(&r.Dir, "firewall rule dir"),
						"proto":  d.str(&r.Proto, "firewall rule proto"),
						"port":   d.str(&ports, "firewall rule port"),
						"cidr":   d.str(&r.CIDR, "firewall rule cidr"),
						"action": d.str(&r.Action, "firewall rule action"),
					})
					lo, hi, err := policy.ParsePorts(ports)
					if err != nil {
						d.report(d.fail(rn, "%v", err))
					}
					r.PortLo, r.PortHi = lo, hi
					fw.Rules = append(fw.Rules, r)
				}),
			})
			if err := policy.CheckFirewall(fw); err != nil {
				return d.fail(v, "vm %q: %v", vm.Name, err)
			}
			vm.Firewall = fw
			return nil
		},
		"dhcp": d.flag(&vm.DHCP, "vm dhcp"),
		"vnat": d.flag(&vm.VNAT, "vm vnat"),
	})
	return vm
}

// validateVMs checks the VMs: a name is unique within its farm (blue and
// red may both have a web1), and a name no other kind of node has.
func validateVMs(c *checker, f *File) {
	perSubnet := map[string]int{}
	type holder struct {
		vm   string
		line int
	}
	vifs := map[[2]string]holder{} // host, interface
	inFarm := map[string]int{}     // FARM/VM -> line

	for _, vm := range f.VMs {
		if !vmNameRE.MatchString(vm.Name) {
			c.fail(vm.Line, "vm name %q must be 1-11 lowercase letters or digits, starting with a letter", vm.Name)
			continue
		}
		id := vm.Farm() + "/" + vm.Name
		if first, dup := inFarm[id]; dup {
			c.fail(vm.Line, "duplicate vm %q in farm %q (first defined on line %d; a VM's name is unique within its farm)", vm.Name, vm.Farm(), first)
			continue
		}
		inFarm[id] = vm.Line
		// Every VM of a name claims it, the first one for all: a host, an
		// external, a sliver may not take a name VMs have, in any farm.
		if holder, ok := c.claimNode("vm", vm.Name, vm.Line); !ok && holder.kind != "vm" {
			c.fail(vm.Line, "vm name %q is already a host or reserved name", vm.Name)
			continue
		}
		if !c.isNode("host", vm.Host) {
			c.fail(orLine(vm.HostLine, vm.Line), "vm %q: host %q is not defined under hosts", vm.Name, vm.Host)
		}
		if !c.subnets[vm.Subnet] {
			c.fail(orLine(vm.SubnetLine, vm.Line), "vm %q: subnet %q is not defined (write it as farm/subnet, e.g. blue/web)", vm.Name, vm.Subnet)
		}
		// The API's check, so a file says no more and no less than
		// `vm create --interface` would.
		if vm.InterfaceLine > 0 {
			if err := intent.CheckInterface("interface", vm.Interface); err != nil {
				c.fail(vm.InterfaceLine, "vm %q: %v", vm.Name, err)
				continue
			}
		}
		// As the API answers 409: one interface carries one guest.
		key := [2]string{vm.Host, vm.Vif()}
		if h, taken := vifs[key]; taken {
			c.fail(orLine(vm.InterfaceLine, vm.Line), "vm %q: interface %s on host %q is vm %q's already (line %d)", vm.Name, vm.Vif(), vm.Host, h.vm, h.line)
		} else {
			vifs[key] = holder{vm.Name, vm.Line}
		}
		perSubnet[vm.Subnet]++
		if n := c.plan.MaxVMs(); perSubnet[vm.Subnet] == n+1 {
			c.fail(vm.Line, "subnet %q holds more than %d VMs, all the address plan %v has room for", vm.Subnet, n, c.plan)
		}
	}
}

// VMNode is the lab node of v, a VM of f: its name, or FARM/VM when another
// farm of f has a VM of that name too (then the bare name is no node: it
// would be either). The lab names the node's namespace after it
// (lab.NamespaceOf).
func (f *File) VMNode(v VM) string {
	for _, o := range f.VMs {
		if o.Name == v.Name && o.Farm() != v.Farm() {
			return v.Farm() + "/" + v.Name
		}
	}
	return v.Name
}

// VMByNode returns the VM whose lab node is node (VMNode).
func (f *File) VMByNode(node string) (VM, bool) {
	farm, name, qualified := strings.Cut(node, "/")
	if !qualified {
		name = node
	}
	for _, v := range f.VMs {
		if v.Name == name && (!qualified || v.Farm() == farm) && f.VMNode(v) == node {
			return v, true
		}
	}
	return VM{}, false
}

// VMOf returns farm/subnet's VM named name.
func (f *File) VMOf(farm, subnet, name string) (VM, bool) {
	for _, v := range f.VMs {
		if v.Name == name && v.Subnet == farm+"/"+subnet {
			return v, true
		}
	}
	return VM{}, false
}
