package topology

import (
	"gopkg.in/yaml.v3"

	"github.com/onehop/onehop/internal/addrplan"
)

// planSection reads the address plan the lab's cloud is created with
// (`plan: 10.0.0.0/8:12/6/6`, addrplan.Parse; none: the default 10.f.s.h).
// It comes first: the fabric must stay outside the plan's prefix, and the
// farms, subnets and VMs must fit its split.
var planSection = section{
	key:    "plan",
	decode: func(d *decoder, v *yaml.Node, f *File) { d.report(d.str(&f.Plan, "plan")(v)); f.PlanLine = v.Line },
	validate: func(c *checker, f *File) {
		c.plan = addrplan.Default()
		if f.Plan == "" {
			return
		}
		p, err := addrplan.Parse(f.Plan)
		if err != nil {
			c.fail(orLine(f.PlanLine, f.Line), "plan %q: %v", f.Plan, err)
			return
		}
		c.plan = p
	},
}

// AddrPlan is the file's address plan (the default when it names none);
// valid after Parse.
func (f *File) AddrPlan() addrplan.Plan {
	if f.Plan == "" {
		return addrplan.Default()
	}
	return addrplan.MustParse(f.Plan)
}
