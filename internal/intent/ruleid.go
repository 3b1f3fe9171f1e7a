package intent

import "slices"

// Rules and firewall rules are named by ids, not by their place in a list,
// so that deleting one never renames another. A record written before ids
// existed has rules without one: NumberRules gives them ids in list order
// after the highest the record knows, the same ids every time it is read,
// so they are stable before they are ever stored; the controller stores
// them with the record's next write (a farm's or VM's record is rewritten
// whenever one of its rules changes), and an unchanged record keeps
// yielding the same ids.

// NumberRules gives every rule of f without an id one and returns f. The
// rules are copied first: f may share them with a cache.
func (f Farm) NumberRules() Farm {
	f.Rules = slices.Clone(f.Rules)
	f.LastRuleID = number(f.Rules, f.LastRuleID, func(r *Rule) *uint32 { return &r.ID })
	return f
}

// NumberRules is Farm.NumberRules for a VM's firewall; nil stays nil.
func (fw *Firewall) NumberRules() *Firewall {
	if fw == nil {
		return nil
	}
	out := *fw
	out.Rules = slices.Clone(fw.Rules)
	out.LastRuleID = number(out.Rules, out.LastRuleID, func(r *FirewallRule) *uint32 { return &r.ID })
	return &out
}

// WithoutIDs is fw without rule ids, as a host's datapath needs it: the
// ids name rules for people, the order alone decides. Keeping them out of
// the desired state means numbering old records rewrites no host's key.
func (fw *Firewall) WithoutIDs() *Firewall {
	if fw == nil {
		return nil
	}
	out := *fw
	out.LastRuleID = 0
	out.Rules = slices.Clone(fw.Rules)
	for i := range out.Rules {
		out.Rules[i].ID = 0
	}
	return &out
}

// number gives each item of list without an id the next after last (at
// least the highest id in list) and returns the highest id given.
func number[T any](list []T, last uint32, id func(*T) *uint32) uint32 {
	for i := range list {
		last = max(last, *id(&list[i]))
	}
	for i := range list {
		if *id(&list[i]) == 0 {
			last++
			*id(&list[i]) = last
		}
	}
	return last
}
