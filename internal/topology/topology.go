// Package topology reads and validates a lab topology file: the fabric, the
// hosts, the farms with their subnets, and the VMs. Validation is complete
// before anything is built, and every error names the file line it is about.
package topology

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/policy"
)

// Datapath modes a lab can be built with.
const (
	DatapathOnehop = "onehop" // eBPF on every vif and uplink, agents, controller
	DatapathBridge = "bridge" // a Linux bridge per host: the physical baseline for benchmarks
)

// File is a parsed topology file.
type File struct {
	Path     string `yaml:"-"`
	Name     string `yaml:"name"`
	Datapath string `yaml:"datapath"`
	Fabric   Fabric `yaml:"fabric"`
	ARP      ARP    `yaml:"arp"`
	Hosts    []Host `yaml:"hosts"`
	Farms    []Farm `yaml:"farms"`
	VMs      []VM   `yaml:"vms"`
	Line     int    `yaml:"-"`
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

// Fabric is the flat L2 underlay every host's uplink joins.
type Fabric struct {
	CIDR       string `yaml:"cidr"`
	Controller string `yaml:"controller"`
	Line       int    `yaml:"-"`
}

// Host is one physical server.
type Host struct {
	Name    string `yaml:"name"`
	Address string `yaml:"address"`
	Line    int    `yaml:"-"`
}

// Farm is one tenant's network.
type Farm struct {
	Name    string   `yaml:"name"`
	Subnets []Subnet `yaml:"subnets"`
	Rules   []Rule   `yaml:"rules"`
	Peers   []string `yaml:"peers"` // farms this farm agrees to talk to
	// ProxyARP: the datapath answers a VM's ARP for another subnet with
	// the gateway's MAC.
	ProxyARP bool `yaml:"proxy_arp"`
	Line     int  `yaml:"-"`
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

// Subnet is one /24 of a farm.
type Subnet struct {
	Name string `yaml:"name"`
	Line int    `yaml:"-"`
}

// VM is one guest, placed on a host, in farm/subnet.
type VM struct {
	Name   string `yaml:"name"`
	Host   string `yaml:"host"`
	Subnet string `yaml:"subnet"`
	// DHCP leaves the VM's interface without an address: the VM asks for it
	// (onehop answers on the VM's host).
	DHCP bool `yaml:"dhcp"`
	// Firewall is the VM's own firewall, if it has one.
	Firewall *intent.Firewall `yaml:"-"`
	Line     int              `yaml:"-"`
	// Lines of the host and subnet values, so an error points at the field.
	HostLine, SubnetLine int `yaml:"-"`
}

// Farm returns the farm part of the VM's "farm/subnet".
func (v VM) Farm() string { f, _, _ := strings.Cut(v.Subnet, "/"); return f }

// SubnetName returns the subnet part of the VM's "farm/subnet".
func (v VM) SubnetName() string { _, s, _ := strings.Cut(v.Subnet, "/"); return s }

var (
	// Host and VM names become parts of interface names (p-HOST in the
	// fabric, vif-VM on the host), which Linux caps at 15 bytes.
	hostNameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,11}$`)
	vmNameRE   = regexp.MustCompile(`^[a-z][a-z0-9]{0,10}$`)
	nameRE     = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)
	labNameRE  = regexp.MustCompile(`^[a-z][a-z0-9]{0,15}$`)
	reserved   = map[string]bool{"fabric": true, "controller": true}
	tenantNet  = netip.MustParsePrefix("10.0.0.0/8")
)

// Load reads, parses and validates path.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read topology: %w", err)
	}
	return Parse(path, data)
}

// Parse parses and validates data; path is only used in error messages.
func Parse(path string, data []byte) (*File, error) {
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(root.Content) == 0 {
		return nil, fmt.Errorf("%s: empty topology file", path)
	}
	f := &File{Path: path}
	if err := decode(path, root.Content[0], f); err != nil {
		return nil, err
	}
	if err := f.validate(); err != nil {
		return nil, err
	}
	return f, nil
}

// decode walks the YAML tree by hand so that every object knows its line and
// a misspelt key is an error rather than silently ignored.
func decode(path string, n *yaml.Node, f *File) error {
	fail := func(n *yaml.Node, format string, a ...any) error {
		return fmt.Errorf("%s:%d: %s", path, n.Line, fmt.Sprintf(format, a...))
	}
	var errs []error
	mapping := func(n *yaml.Node, what string, fields map[string]func(*yaml.Node) error) {
		if n.Kind != yaml.MappingNode {
			errs = append(errs, fail(n, "%s must be a mapping", what))
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			set, ok := fields[k.Value]
			if !ok {
				known := make([]string, 0, len(fields))
				for name := range fields {
					known = append(known, name)
				}
				errs = append(errs, fail(k, "unknown key %q in %s (known: %s)", k.Value, what, strings.Join(sorted(known), ", ")))
				continue
			}
			if err := set(v); err != nil {
				errs = append(errs, err)
			}
		}
	}
	str := func(dst *string, what string) func(*yaml.Node) error {
		return func(v *yaml.Node) error {
			if v.Kind != yaml.ScalarNode {
				return fail(v, "%s must be a string", what)
			}
			*dst = v.Value
			return nil
		}
	}
	duration := func(dst *time.Duration, what string) func(*yaml.Node) error {
		return func(v *yaml.Node) error {
			d, err := time.ParseDuration(v.Value)
			if v.Kind != yaml.ScalarNode || err != nil || d < time.Second {
				return fail(v, "%s %q must be a duration of at least 1s, like 30s or 5m", what, v.Value)
			}
			*dst = d
			return nil
		}
	}
	flag := func(dst *bool, what string) func(*yaml.Node) error {
		return func(v *yaml.Node) error {
			if v.Kind != yaml.ScalarNode || (v.Value != "true" && v.Value != "false") {
				return fail(v, "%s must be true or false", what)
			}
			*dst = v.Value == "true"
			return nil
		}
	}
	at := func(line *int, set func(*yaml.Node) error) func(*yaml.Node) error {
		return func(v *yaml.Node) error { *line = v.Line; return set(v) }
	}
	seq := func(what string, each func(*yaml.Node)) func(*yaml.Node) error {
		return func(v *yaml.Node) error {
			if v.Kind != yaml.SequenceNode {
				return fail(v, "%s must be a list", what)
			}
			for _, item := range v.Content {
				each(item)
			}
			return nil
		}
	}

	f.Line = n.Line
	mapping(n, "topology", map[string]func(*yaml.Node) error{
		"name":     str(&f.Name, "name"),
		"datapath": str(&f.Datapath, "datapath"),
		"arp": func(v *yaml.Node) error {
			f.ARP.Line = v.Line
			mapping(v, "arp", map[string]func(*yaml.Node) error{
				"table_size": func(n *yaml.Node) error {
					size, err := strconv.Atoi(n.Value)
					if n.Kind != yaml.ScalarNode || err != nil || size < 64 || size > 1<<20 {
						return fail(n, "arp.table_size %q must be a whole number from 64 to 1048576", n.Value)
					}
					f.ARP.TableSize = size
					return nil
				},
				"refresh": duration(&f.ARP.Refresh, "arp.refresh"),
				"idle":    duration(&f.ARP.Idle, "arp.idle"),
			})
			return nil
		},
		"fabric": func(v *yaml.Node) error {
			f.Fabric.Line = v.Line
			mapping(v, "fabric", map[string]func(*yaml.Node) error{
				"cidr":       str(&f.Fabric.CIDR, "fabric.cidr"),
				"controller": str(&f.Fabric.Controller, "fabric.controller"),
			})
			return nil
		},
		"hosts": seq("hosts", func(item *yaml.Node) {
			h := Host{Line: item.Line}
			mapping(item, "host", map[string]func(*yaml.Node) error{
				"name":    str(&h.Name, "host name"),
				"address": str(&h.Address, "host address"),
			})
			f.Hosts = append(f.Hosts, h)
		}),
		"farms": seq("farms", func(item *yaml.Node) {
			fm := Farm{Line: item.Line}
			mapping(item, "farm", map[string]func(*yaml.Node) error{
				"name": str(&fm.Name, "farm name"),
				"subnets": seq("subnets", func(sn *yaml.Node) {
					s := Subnet{Line: sn.Line}
					mapping(sn, "subnet", map[string]func(*yaml.Node) error{
						"name": str(&s.Name, "subnet name"),
					})
					fm.Subnets = append(fm.Subnets, s)
				}),
				"proxy_arp": flag(&fm.ProxyARP, "farm proxy_arp"),
				"peers": seq("peers", func(p *yaml.Node) {
					var name string
					if err := str(&name, "peer")(p); err != nil {
						errs = append(errs, err)
						return
					}
					fm.Peers = append(fm.Peers, name)
				}),
				"rules": seq("rules", func(rn *yaml.Node) {
					r := Rule{Line: rn.Line}
					var port string
					mapping(rn, "rule", map[string]func(*yaml.Node) error{
						"from":  str(&r.From, "rule from"),
						"to":    str(&r.To, "rule to"),
						"proto": str(&r.Proto, "rule proto"),
						"port":  str(&port, "rule port"),
					})
					if port != "" {
						n, err := strconv.ParseUint(port, 10, 16)
						if err != nil || n == 0 {
							errs = append(errs, fail(rn, "rule port %q is not a port number 1-65535", port))
						}
						r.Port = uint16(n)
					}
					fm.Rules = append(fm.Rules, r)
				}),
			})
			f.Farms = append(f.Farms, fm)
		}),
		"vms": seq("vms", func(item *yaml.Node) {
			vm := VM{Line: item.Line}
			mapping(item, "vm", map[string]func(*yaml.Node) error{
				"name":   str(&vm.Name, "vm name"),
				"host":   at(&vm.HostLine, str(&vm.Host, "vm host")),
				"subnet": at(&vm.SubnetLine, str(&vm.Subnet, "vm subnet")),
				"firewall": func(v *yaml.Node) error {
					fw := &intent.Firewall{DefaultIn: "allow", DefaultOut: "allow"}
					mapping(v, "firewall", map[string]func(*yaml.Node) error{
						"default_in":  str(&fw.DefaultIn, "firewall default_in"),
						"default_out": str(&fw.DefaultOut, "firewall default_out"),
						"rules": seq("firewall rules", func(rn *yaml.Node) {
							var r intent.FirewallRule
							var ports string
							mapping(rn, "firewall rule", map[string]func(*yaml.Node) error{
								"dir":    str(&r.Dir, "firewall rule dir"),
								"proto":  str(&r.Proto, "firewall rule proto"),
								"port":   str(&ports, "firewall rule port"),
								"cidr":   str(&r.CIDR, "firewall rule cidr"),
								"action": str(&r.Action, "firewall rule action"),
							})
							lo, hi, err := policy.ParsePorts(ports)
							if err != nil {
								errs = append(errs, fail(rn, "%v", err))
							}
							r.PortLo, r.PortHi = lo, hi
							fw.Rules = append(fw.Rules, r)
						}),
					})
					if err := policy.CheckFirewall(fw); err != nil {
						return fail(v, "vm %q: %v", vm.Name, err)
					}
					vm.Firewall = fw
					return nil
				},
				"dhcp": flag(&vm.DHCP, "vm dhcp"),
			})
			f.VMs = append(f.VMs, vm)
		}),
	})
	return errors.Join(errs...)
}

func (f *File) validate() error {
	var errs []error
	fail := func(line int, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s:%d: %s", f.Path, line, fmt.Sprintf(format, a...)))
	}

	if f.Name == "" {
		f.Name = "lab"
	}
	if !labNameRE.MatchString(f.Name) {
		fail(f.Line, "lab name %q must be 1-16 lowercase letters or digits, starting with a letter", f.Name)
	}
	switch f.Datapath {
	case "":
		f.Datapath = DatapathOnehop
	case DatapathOnehop, DatapathBridge:
	default:
		fail(f.Line, "datapath %q is not one of %s, %s", f.Datapath, DatapathOnehop, DatapathBridge)
	}

	if f.Fabric.CIDR == "" {
		f.Fabric.CIDR = "192.168.100.0/24"
	}
	fabric, err := netip.ParsePrefix(f.Fabric.CIDR)
	fabricOK := err == nil && fabric.Addr().Is4() && fabric.Bits() >= 8 && fabric.Bits() <= 28 && !fabric.Overlaps(tenantNet)
	switch {
	case err != nil:
		fail(f.Fabric.Line, "fabric.cidr %q is not a CIDR: %v", f.Fabric.CIDR, err)
	case !fabricOK:
		fail(f.Fabric.Line, "fabric.cidr %s must be IPv4 with a prefix of /8 to /28 outside the tenant space %s", fabric, tenantNet)
	}
	fabric = fabric.Masked()
	usedAddr := map[netip.Addr]string{}
	checkAddr := func(line int, who, s string) {
		a, err := netip.ParseAddr(s)
		if err != nil {
			fail(line, "%s address %q is not an IPv4 address", who, s)
			return
		}
		if !fabricOK {
			return
		}
		if !fabric.Contains(a) || a == fabric.Addr() || a == lastAddr(fabric) {
			fail(line, "%s address %s is not a usable address of fabric %s", who, a, fabric)
			return
		}
		if other, dup := usedAddr[a]; dup {
			fail(line, "%s address %s is already used by %s", who, a, other)
			return
		}
		usedAddr[a] = who
	}
	if f.Fabric.Controller == "" && fabricOK {
		f.Fabric.Controller = fabric.Addr().Next().String()
	}
	if f.Fabric.Controller != "" {
		checkAddr(f.Fabric.Line, "controller", f.Fabric.Controller)
	}

	if len(f.Hosts) == 0 {
		fail(f.Line, "no hosts: a lab needs at least one host under hosts:")
	}
	hosts := map[string]bool{}
	for i := range f.Hosts {
		h := &f.Hosts[i]
		switch {
		case !hostNameRE.MatchString(h.Name):
			fail(h.Line, "host name %q must be 1-12 lowercase letters or digits, starting with a letter", h.Name)
			continue
		case reserved[h.Name]:
			fail(h.Line, "host name %q is reserved", h.Name)
			continue
		case hosts[h.Name]:
			fail(h.Line, "duplicate host %q", h.Name)
			continue
		}
		hosts[h.Name] = true
		if h.Address == "" && fabricOK {
			h.Address = nthAddr(fabric, 10+i).String()
		}
		if h.Address != "" {
			checkAddr(h.Line, "host "+h.Name, h.Address)
		}
	}

	subnets := map[string]bool{}
	farms := map[string]bool{}
	for _, fm := range f.Farms {
		if !nameRE.MatchString(fm.Name) {
			fail(fm.Line, "farm name %q must be lowercase letters, digits or '-', starting with a letter", fm.Name)
			continue
		}
		if farms[fm.Name] {
			fail(fm.Line, "duplicate farm %q", fm.Name)
			continue
		}
		farms[fm.Name] = true
		if len(fm.Subnets) == 0 {
			fail(fm.Line, "farm %q has no subnets", fm.Name)
		}
		if len(fm.Subnets) > 255 {
			fail(fm.Line, "farm %q has %d subnets; at most 255 fit in 10.f.s.h", fm.Name, len(fm.Subnets))
		}
		for _, s := range fm.Subnets {
			key := fm.Name + "/" + s.Name
			switch {
			case !nameRE.MatchString(s.Name):
				fail(s.Line, "subnet name %q must be lowercase letters, digits or '-', starting with a letter", s.Name)
			case subnets[key]:
				fail(s.Line, "duplicate subnet %q", key)
			default:
				subnets[key] = true
			}
		}
	}
	if len(f.Farms) > 255 {
		fail(f.Line, "%d farms; at most 255 fit in 10.f.s.h", len(f.Farms))
	}

	for _, fm := range f.Farms {
		for _, p := range fm.Peers {
			if !farms[p] || p == fm.Name {
				fail(fm.Line, "farm %q peers with %q, which is not another farm of this file", fm.Name, p)
			}
		}
		for _, r := range fm.Rules {
			from, to := fm.Qualify(r.From), fm.Qualify(r.To)
			switch {
			case !subnets[from]:
				fail(r.Line, "rule of farm %q: from %q is not a subnet (write web, or farm/subnet)", fm.Name, r.From)
			case !subnets[to]:
				fail(r.Line, "rule of farm %q: to %q is not a subnet (write web, or farm/subnet)", fm.Name, r.To)
			case from == to:
				fail(r.Line, "rule of farm %q: from and to are the same subnet, which is always open", fm.Name)
			case !strings.HasPrefix(from, fm.Name+"/") && !strings.HasPrefix(to, fm.Name+"/"):
				fail(r.Line, "rule of farm %q: neither %s nor %s belongs to it", fm.Name, from, to)
			}
			switch strings.ToLower(r.Proto) {
			case "", "any", "icmp":
				if r.Port != 0 {
					fail(r.Line, "rule of farm %q: a port needs proto tcp or udp", fm.Name)
				}
			case "tcp", "udp":
			default:
				fail(r.Line, "rule of farm %q: proto %q is not tcp, udp, icmp or any", fm.Name, r.Proto)
			}
		}
	}

	vms := map[string]int{}
	perSubnet := map[string]int{}
	for _, vm := range f.VMs {
		if !vmNameRE.MatchString(vm.Name) {
			fail(vm.Line, "vm name %q must be 1-11 lowercase letters or digits, starting with a letter", vm.Name)
			continue
		}
		if reserved[vm.Name] || hosts[vm.Name] {
			fail(vm.Line, "vm name %q is already a host or reserved name", vm.Name)
			continue
		}
		if line, dup := vms[vm.Name]; dup {
			fail(vm.Line, "duplicate vm %q (first defined on line %d)", vm.Name, line)
			continue
		}
		vms[vm.Name] = vm.Line
		if !hosts[vm.Host] {
			fail(orLine(vm.HostLine, vm.Line), "vm %q: host %q is not defined under hosts", vm.Name, vm.Host)
		}
		if !subnets[vm.Subnet] {
			fail(orLine(vm.SubnetLine, vm.Line), "vm %q: subnet %q is not defined (write it as farm/subnet, e.g. blue/web)", vm.Name, vm.Subnet)
		}
		perSubnet[vm.Subnet]++
		if perSubnet[vm.Subnet] == 254 {
			fail(vm.Line, "subnet %q holds more than 253 VMs", vm.Subnet)
		}
	}
	return errors.Join(errs...)
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

// FabricPrefix returns the fabric's CIDR; valid after Parse.
func (f *File) FabricPrefix() netip.Prefix {
	return netip.MustParsePrefix(f.Fabric.CIDR).Masked()
}

func nthAddr(p netip.Prefix, n int) netip.Addr {
	a := p.Addr()
	for i := 0; i < n; i++ {
		a = a.Next()
	}
	return a
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v |= (1 << (32 - p.Bits())) - 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func sorted(s []string) []string {
	sort.Strings(s)
	return s
}

func orLine(specific, fallback int) int {
	if specific > 0 {
		return specific
	}
	return fallback
}

// VifName is the host-side interface of a VM in the lab.
func VifName(vm string) string { return intent.VifName(vm) }

// CheckFarmName, CheckSubnetName, CheckVMName and CheckHostName apply the
// topology file's naming rules to names that arrive through the API.
func CheckFarmName(name string) error { return checkName("farm", name, nameRE, 32) }

// CheckSubnetName: see CheckFarmName.
func CheckSubnetName(name string) error { return checkName("subnet", name, nameRE, 32) }

// CheckVMName: see CheckFarmName.
func CheckVMName(name string) error {
	if reserved[name] {
		return fmt.Errorf("vm name %q is reserved", name)
	}
	return checkName("vm", name, vmNameRE, 11)
}

func checkName(kind, name string, re *regexp.Regexp, max int) error {
	if !re.MatchString(name) {
		return fmt.Errorf("%s name %q must be lowercase letters and digits (and '-' for farms and subnets), starting with a letter, at most %d characters", kind, name, max)
	}
	return nil
}
