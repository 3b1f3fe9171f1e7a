// Package topology reads and validates a lab topology file: the fabric, the
// hosts, the farms with their subnets, the VMs, the slivers and the external
// machines. Validation is complete before anything is built, and every error
// names the file line it is about.
//
// Each top-level key is a section (decode.go): the lab's name and datapath
// here, the fabric and ARP tuning in fabric.go, one file per node kind
// (hosts.go, vms.go, slivers.go, externals.go) and farms.go; uplinks.go
// allocates hosts' extra uplink addresses last. A new node kind adds its own
// file and one line to sections.
package topology

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"regexp"
	"sort"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
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
	// Plan is the cloud's address plan (addrplan.Parse), "" the default.
	Plan     string `yaml:"plan"`
	PlanLine int    `yaml:"-"`
	Fabric   Fabric `yaml:"fabric"`
	ARP      ARP    `yaml:"arp"`
	Hosts    []Host `yaml:"hosts"`
	Farms    []Farm `yaml:"farms"`
	VMs      []VM   `yaml:"vms"`
	Line     int    `yaml:"-"`
	// extra holds the entries of sections that keep them outside the
	// fields above (node kinds added later), by section key.
	extra map[string]any
}

var (
	labNameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,15}$`)
	nameRE    = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)
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
// Every error it returns starts with path:LINE.
func Parse(path string, data []byte) (*File, error) {
	if err := checkText(path, data); err != nil {
		return nil, err
	}
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s:1: empty topology file", path)
		}
		return nil, yamlError(path, err)
	}
	var second yaml.Node
	switch err := dec.Decode(&second); {
	case err == nil:
		return nil, fmt.Errorf("%s:%d: a second YAML document; a topology file holds one", path, max(second.Line, 1))
	case !errors.Is(err, io.EOF):
		return nil, yamlError(path, err)
	}
	if len(root.Content) == 0 {
		return nil, fmt.Errorf("%s:1: empty topology file", path)
	}
	f := &File{Path: path}
	d := &decoder{path: path}
	top := root.Content[0]
	f.Line = max(top.Line, 1)
	fields := map[string]field{}
	for _, s := range sections {
		s := s
		if s.key == "" {
			continue
		}
		fields[s.key] = func(v *yaml.Node) error { s.decode(d, v, f); return nil }
	}
	d.mapping(top, "topology", fields)
	if err := errors.Join(d.errs...); err != nil {
		return nil, err
	}
	c := newChecker(path)
	for _, s := range sections {
		s.validate(c, f)
	}
	if err := c.err(); err != nil {
		return nil, err
	}
	return f, nil
}

// yamlLineRE finds the line yaml.v3 puts in its syntax errors.
var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlError turns a yaml.v3 syntax error into path:LINE: reason.
func yamlError(path string, err error) error {
	msg := err.Error()
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		return fmt.Errorf("%s:%s: %s", path, m[1], m[2])
	}
	// The few errors yaml.v3 reports without a line (e.g. "did not find
	// expected node content" at the very end) are about the end of input.
	return fmt.Errorf("%s:%d: %s", path, 1, strings.TrimPrefix(msg, "yaml: "))
}

// checkText refuses what yaml.v3 would reject without saying where: bytes
// that are not UTF-8 and control characters, each with its line.
func checkText(path string, data []byte) error {
	line := 1
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			return fmt.Errorf("%s:%d: byte 0x%02x is not UTF-8 text", path, line, data[i])
		case r == '\n':
			line++
		case r == '\t' || r == '\r':
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == 0xfeff && i > 0 || r >= 0xfffe && r <= 0xffff:
			return fmt.Errorf("%s:%d: control character %U is not allowed in a topology file", path, line, r)
		}
		i += size
	}
	return nil
}

// labSection reads the lab's name (plain scalars, not node kinds, are
// sections too, so every top-level key is read the same way).
var labSection = section{
	key:    "name",
	decode: func(d *decoder, v *yaml.Node, f *File) { d.report(d.str(&f.Name, "name")(v)) },
	validate: func(c *checker, f *File) {
		if f.Name == "" {
			f.Name = "lab"
		}
		if !labNameRE.MatchString(f.Name) {
			c.fail(f.Line, "lab name %q must be 1-16 lowercase letters or digits, starting with a letter", f.Name)
		}
	},
}

// datapathSection reads which datapath the lab is built with.
var datapathSection = section{
	key:    "datapath",
	decode: func(d *decoder, v *yaml.Node, f *File) { d.report(d.str(&f.Datapath, "datapath")(v)) },
	validate: func(c *checker, f *File) {
		switch f.Datapath {
		case "":
			f.Datapath = DatapathOnehop
		case DatapathOnehop, DatapathBridge:
		default:
			c.fail(f.Line, "datapath %q is not one of %s, %s", f.Datapath, DatapathOnehop, DatapathBridge)
		}
	},
}

// FabricPrefix returns the fabric's CIDR; valid after Parse.
func (f *File) FabricPrefix() netip.Prefix {
	return netip.MustParsePrefix(f.Fabric.CIDR).Masked()
}

func nthAddr(p netip.Prefix, n int) netip.Addr {
	a := p.Addr()
	for i := 0; i < n && a.IsValid(); i++ {
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

// etcdRoot is etcd's administrator user: a host's agent certificate has
// the host's name for its common name, which etcd takes for its user, so
// no host may be called so (controller/etcdauth.go).
const etcdRoot = "root"

var errEtcdRoot = fmt.Errorf("host name %q is etcd's administrator user: an agent certificate of that name would administer etcd", etcdRoot)

// CheckHostName: see CheckFarmName (`host add`). A host's name becomes
// part of interface names (p-HOST on the fabric), hence its 12 bytes.
func CheckHostName(name string) error {
	if reserved[name] {
		return fmt.Errorf("host name %q is reserved", name)
	}
	if name == etcdRoot {
		return errEtcdRoot
	}
	if !hostNameRE.MatchString(name) {
		return fmt.Errorf("host name %q must be 1-12 lowercase letters or digits, starting with a letter", name)
	}
	return nil
}

func checkName(kind, name string, re *regexp.Regexp, max int) error {
	if !re.MatchString(name) {
		return fmt.Errorf("%s name %q must be lowercase letters and digits (and '-' for farms and subnets), starting with a letter, at most %d characters", kind, name, max)
	}
	return nil
}
