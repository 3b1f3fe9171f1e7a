package topology

import (
	"strconv"

	"gopkg.in/yaml.v3"
)

// External is a plain machine on the fabric, the Internet as far as the lab
// is concerned: its own fabric address, no onehop on it (but the VNAT
// daemon, an endpoint's own, with vnat: true).
type External struct {
	Name string `yaml:"name"`
	// Address is its fabric address; allocated after the hosts' and the
	// controller's when not given.
	Address string `yaml:"address"`
	// VNAT makes the external an endpoint whose connections survive a
	// change of its address (issue 10): the lab runs the VNAT daemon in it.
	VNAT bool `yaml:"vnat"`
	Line int  `yaml:"-"`
}

const externalsKey = "externals"

var externalsSection = section{
	key: externalsKey,
	decode: func(d *decoder, v *yaml.Node, f *File) {
		var es []External
		d.report(d.seq("externals", func(item *yaml.Node) {
			e := External{Line: item.Line}
			d.mapping(item, "external", map[string]field{
				"name":    d.str(&e.Name, "external name"),
				"address": d.str(&e.Address, "external address"),
				"vnat":    d.flag(&e.VNAT, "external vnat"),
			})
			es = append(es, e)
		})(v))
		setExtra(f, externalsKey, es)
	},
	validate: func(c *checker, f *File) {
		es := f.Externals()
		// Explicit addresses first, so an allocated one never takes them.
		for i := range es {
			if es[i].Address != "" {
				c.fabricAddr(es[i].Line, "external "+es[i].Name, es[i].Address)
			}
		}
		for i := range es {
			e := &es[i]
			// An external's name is its namespace's and its fabric
			// port's (p-NAME), like a host's.
			if !hostNameRE.MatchString(e.Name) {
				c.fail(e.Line, "external name %q must be 1-12 lowercase letters or digits, starting with a letter", e.Name)
				continue
			}
			if holder, ok := c.claimNode("external", e.Name, e.Line); !ok {
				c.fail(e.Line, "external name %q is %s", e.Name, describeHolder(holder, "external"))
				continue
			}
			if e.Address == "" {
				e.Address = c.allocate(e.Line, "external "+e.Name, 10+len(f.Hosts))
			}
		}
	},
}

// Externals are the lab's plain machines on the fabric, in file order.
func (f *File) Externals() []External { return extra[[]External](f, externalsKey) }

// ExternalByName returns the external named name.
func (f *File) ExternalByName(name string) (External, bool) {
	for _, e := range f.Externals() {
		if e.Name == name {
			return e, true
		}
	}
	return External{}, false
}

// describeHolder says who already has a node name, for an error about a
// node of kind: "reserved", "a duplicate (first defined on line 3)", "already
// the host defined on line 3".
func describeHolder(holder nodeName, kind string) string {
	switch holder.kind {
	case "":
		return "reserved"
	case kind:
		return "defined twice (first on line " + strconv.Itoa(holder.line) + ")"
	}
	return "already the " + holder.kind + " defined on line " + strconv.Itoa(holder.line)
}
