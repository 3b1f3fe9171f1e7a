package observe

import (
	"net/netip"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/filter"
	"github.com/onehop/onehop/internal/intent"
)

// Rules finds the visibility rule that admitted a flow, from the intent the
// policy compiler compiles (policy.Visibility): the datapath says a flow
// was admitted, the intent says by which rule.
type Rules struct {
	subnets map[[2]uint16]string // {farm id, subnet id} -> farm/subnet
	rules   map[string][]intent.Rule
	farms   map[uint16]string
}

// NewRules indexes farms' rules and subnets.
func NewRules(farms []intent.Farm, subnets []intent.Subnet) *Rules {
	r := &Rules{subnets: map[[2]uint16]string{}, rules: map[string][]intent.Rule{}, farms: map[uint16]string{}}
	ids := map[string]uint16{}
	for _, f := range farms {
		ids[f.Name] = f.ID
		r.farms[f.ID] = f.Name
		r.rules[f.Name] = f.Rules
	}
	for _, s := range subnets {
		r.subnets[[2]uint16{ids[s.Farm], s.ID}] = s.Farm + "/" + s.Name
	}
	return r
}

// Admitting sets e's Rule and RuleFarm when e is a flow between two
// subnets: the first rule of the source's farm from the source's subnet to
// the destination's that takes its protocol and port. A flow inside one
// subnet needs no rule (only the VMs' firewalls had a say) and gets none.
func (r *Rules) Admitting(e *Event) {
	if e.Kind != KindFlow {
		return
	}
	src, err1 := netip.ParseAddr(e.Src)
	dst, err2 := netip.ParseAddr(e.Dst)
	if err1 != nil || err2 != nil {
		return
	}
	plan := addrplan.Current()
	sf, ss, _, ok1 := plan.Split(src)
	df, ds, _, ok2 := plan.Split(dst)
	if !ok1 || !ok2 {
		return
	}
	from, to := r.subnets[[2]uint16{sf, ss}], r.subnets[[2]uint16{df, ds}]
	if from == "" || to == "" || from == to {
		return
	}
	farm := r.farms[sf]
	for _, rule := range r.rules[farm] {
		if rule.From != from || rule.To != to {
			continue
		}
		proto, err := filter.ProtoNumber(rule.Proto)
		if err != nil || (proto != 0 && ProtoName(proto) != e.Proto) {
			continue
		}
		if rule.Port != 0 && rule.Port != e.Dport {
			continue
		}
		e.RuleFarm, e.Rule = farm, rule.ID
		return
	}
}
