package topology

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/onehop/onehop/internal/addrplan"
)

// A section is one top-level key of a topology file: how its value is read
// and how it is checked against the rest of the file. Each node kind keeps its
// section in its own file (hosts.go, vms.go); sections lists them all.
type section struct {
	// key is the top-level key; "" for a section that only validates (it
	// fills in what depends on every section before it, like addresses
	// allocated after all others).
	key string
	// decode reads the key's value into f. It reports what is wrong with
	// the value itself through d and keeps going, so one run names every
	// mistake.
	decode func(d *decoder, v *yaml.Node, f *File)
	// validate checks what decode read against the rest of the file and
	// fills in defaults. It runs for every section, present or not, in the
	// order of sections, so it may rely on the sections before it.
	validate func(c *checker, f *File)
}

// sections are the top-level keys of a topology file, in validation order:
// a key's section may use what the sections before it established (the
// fabric before the addresses on it, hosts before the VMs placed on them).
//
// A new node kind is its own file (a type for its entries, a section that
// decodes and validates them, and a typed accessor on File that reads
// File.extra[key], see extra) plus one line here.
var sections = []section{
	planSection,
	labSection,
	datapathSection,
	fabricSection,
	arpSection,
	hostsSection,
	farmsSection,
	vmsSection,
	externalsSection,
	sliversSection,
	tapsSection,
	wansSection,
	gatewaysSection,
	xtrsSection,
	uplinksSection,
}

// extra returns what the section key stored in f.extra, for node kinds
// that keep their entries there rather than in a field of File.
func extra[T any](f *File, key string) T {
	v, _ := f.extra[key].(T)
	return v
}

// setExtra stores a section's entries in f.extra under its key.
func setExtra(f *File, key string, v any) {
	if f.extra == nil {
		f.extra = map[string]any{}
	}
	f.extra[key] = v
}

// decoder walks the YAML tree by hand so that every object knows its line,
// and a misspelt or repeated key is an error rather than silently ignored
// or silently overridden.
type decoder struct {
	path string
	errs []error
}

func (d *decoder) fail(n *yaml.Node, format string, a ...any) error {
	return fmt.Errorf("%s:%d: %s", d.path, n.Line, fmt.Sprintf(format, a...))
}

// report records an error and goes on.
func (d *decoder) report(err error) {
	if err != nil {
		d.errs = append(d.errs, err)
	}
}

// field reads one key of a mapping.
type field func(v *yaml.Node) error

// mapping reads n, a mapping described as what, key by key. An unknown key
// is reported with the known ones; a key given twice is reported with the
// lines of both (YAML leaves duplicates to the reader, and "last one wins"
// would silently drop what the operator wrote first).
func (d *decoder) mapping(n *yaml.Node, what string, fields map[string]field) {
	if n.Kind != yaml.MappingNode {
		d.report(d.fail(n, "%s must be a mapping", what))
		return
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.report(d.fail(k, "a key in %s must be a plain name", what))
			continue
		}
		if first, dup := seen[k.Value]; dup {
			d.report(d.fail(k, "duplicate key %q in %s (first on line %d, again on line %d)", k.Value, what, first, k.Line))
			continue
		}
		seen[k.Value] = k.Line
		set, ok := fields[k.Value]
		if !ok {
			known := make([]string, 0, len(fields))
			for name := range fields {
				known = append(known, name)
			}
			d.report(d.fail(k, "unknown key %q in %s (known: %s)", k.Value, what, strings.Join(sorted(known), ", ")))
			continue
		}
		d.report(set(v))
	}
}

// str reads a scalar as a string.
func (d *decoder) str(dst *string, what string) field {
	return func(v *yaml.Node) error {
		if v.Kind != yaml.ScalarNode {
			return d.fail(v, "%s must be a string", what)
		}
		*dst = v.Value
		return nil
	}
}

// duration reads a duration of at least a second.
func (d *decoder) duration(dst *time.Duration, what string) field {
	return func(v *yaml.Node) error {
		dur, err := time.ParseDuration(v.Value)
		if v.Kind != yaml.ScalarNode || err != nil || dur < time.Second {
			return d.fail(v, "%s %q must be a duration of at least 1s, like 30s or 5m", what, v.Value)
		}
		*dst = dur
		return nil
	}
}

// integer reads a whole number from lo to hi.
func (d *decoder) integer(dst *int, what string, lo, hi int) field {
	return func(v *yaml.Node) error {
		n, err := strconv.Atoi(v.Value)
		if v.Kind != yaml.ScalarNode || err != nil || n < lo || n > hi {
			return d.fail(v, "%s %q must be a whole number from %d to %d", what, v.Value, lo, hi)
		}
		*dst = n
		return nil
	}
}

// flag reads true or false (only those: YAML 1.1's yes/no/on/off are
// ambiguous enough to refuse).
func (d *decoder) flag(dst *bool, what string) field {
	return func(v *yaml.Node) error {
		if v.Kind != yaml.ScalarNode || (v.Value != "true" && v.Value != "false") {
			return d.fail(v, "%s must be true or false", what)
		}
		*dst = v.Value == "true"
		return nil
	}
}

// at records the line of the value before reading it.
func at(line *int, set field) field {
	return func(v *yaml.Node) error { *line = v.Line; return set(v) }
}

// seq reads a list, item by item.
func (d *decoder) seq(what string, each func(*yaml.Node)) field {
	return func(v *yaml.Node) error {
		if v.Kind != yaml.SequenceNode {
			return d.fail(v, "%s must be a list", what)
		}
		for _, item := range v.Content {
			each(item)
		}
		return nil
	}
}

// checker collects validation errors and what the sections validated so far
// established: the fabric, the addresses used on it, the names of nodes (one
// namespace each, so unique across kinds), farms and subnets.
type checker struct {
	path string
	errs []error
	// plan is the file's address plan (planSection, first).
	plan addrplan.Plan

	fabric   netip.Prefix
	fabricOK bool
	addrs    map[netip.Addr]string
	// next is where allocate looks for a free fabric address next, as an
	// offset into the fabric; 0 until the first allocation.
	next int
	// nodes maps a node name to its kind and the line it was defined on.
	nodes   map[string]nodeName
	farms   map[string]bool
	subnets map[string]bool
	// prefixes are the networks of the cloud-access sections, by user.
	prefixes map[netip.Prefix]string
	// wanEnds maps "gateway/WAN" and "xtr/WAN" to the node on that end.
	wanEnds map[string]string
}

type nodeName struct {
	kind string
	line int
}

func newChecker(path string) *checker {
	return &checker{path: path, addrs: map[netip.Addr]string{}, nodes: map[string]nodeName{},
		farms: map[string]bool{}, subnets: map[string]bool{}}
}

func (c *checker) fail(line int, format string, a ...any) {
	c.errs = append(c.errs, fmt.Errorf("%s:%d: %s", c.path, line, fmt.Sprintf(format, a...)))
}

// reserved are nodes every lab has; no entry may take their names.
var reserved = map[string]bool{"fabric": true, "controller": true}

// claimNode records that a node of kind is named name (defined on line),
// unless the name is reserved or another node has it; then it returns the
// kind and line of what holds the name (kind "" for a reserved name).
func (c *checker) claimNode(kind, name string, line int) (holder nodeName, ok bool) {
	if reserved[name] {
		return nodeName{}, false
	}
	if h, taken := c.nodes[name]; taken {
		return h, false
	}
	c.nodes[name] = nodeName{kind: kind, line: line}
	return nodeName{}, true
}

// isNode reports whether name is a node of kind.
func (c *checker) isNode(kind, name string) bool {
	h, ok := c.nodes[name]
	return ok && h.kind == kind
}

// fabricAddr checks that s is a free, usable address of the fabric and
// records it as who's.
func (c *checker) fabricAddr(line int, who, s string) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		c.fail(line, "%s address %q is not an IPv4 address", who, s)
		return
	}
	if !c.fabricOK {
		return // the fabric's own error says enough
	}
	if !c.fabric.Contains(a) || a == c.fabric.Addr() || a == lastAddr(c.fabric) {
		c.fail(line, "%s address %s is not a usable address of fabric %s", who, a, c.fabric)
		return
	}
	if other, dup := c.addrs[a]; dup {
		c.fail(line, "%s address %s is already used by %s", who, a, other)
		return
	}
	c.addrs[a] = who
}

// allocate gives who the first free usable fabric address at or after
// offset from (or after the last one it gave, if that is further on), and
// records it; "" (with the error reported on line) when the fabric is full.
func (c *checker) allocate(line int, who string, from int) string {
	if !c.fabricOK {
		return ""
	}
	a, ok := NextFabricAddr(c.fabric, max(from, c.next), func(a netip.Addr) bool { _, used := c.addrs[a]; return used })
	if !ok {
		c.fail(line, "%s: no free address left on fabric %s", who, c.fabric)
		return ""
	}
	c.addrs[a] = who
	c.next = offset(c.fabric, a) + 1
	return a.String()
}

// NextFabricAddr is the fabric's address allocator: the first usable
// address of fabric at or after offset from that used does not claim; false
// when there is none. The topology allocates hosts', externals' and extra
// uplinks' addresses with it, and the lab a readdressed external's.
func NextFabricAddr(fabric netip.Prefix, from int, used func(netip.Addr) bool) (netip.Addr, bool) {
	last := lastAddr(fabric)
	for a := nthAddr(fabric, from); a.IsValid() && a.Less(last); a = a.Next() {
		if !used(a) && a != fabric.Addr() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// offset is how far a lies from the start of p.
func offset(p netip.Prefix, a netip.Addr) int {
	x, y := p.Addr().As4(), a.As4()
	u := func(b [4]byte) int { return int(b[0])<<24 | int(b[1])<<16 | int(b[2])<<8 | int(b[3]) }
	return u(y) - u(x)
}

func (c *checker) err() error { return errors.Join(c.errs...) }
