package controller

import (
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/policy"
)

// farmStates is the part of the desired state hosts share: one farm state
// per farm (intent.FarmStatePrefix), its compiled rules, peerings and
// proxy ARP, compiled from the farms and subnets alone.
type farmStates struct {
	marked bool
}

func (*farmStates) records() []recordKind          { return nil }
func (*farmStates) desiredKind() string            { return "" }
func (p *farmStates) reset()                       { p.marked = false }
func (*farmStates) noted(_, _ string, _ bool)      {}
func (*farmStates) hostChanged(_ *model, _ string) {}
func (p *farmStates) farmsChanged(*model)          { p.marked = true }
func (p *farmStates) markAll(*model)               { p.marked = true }

func (p *farmStates) compile(m *model, w *keyWriter) error {
	if !p.marked {
		return nil
	}
	p.marked = false
	want := map[string][]byte{}
	for id, f := range policy.FarmStates(sortedValues(m.farms), sortedValues(m.subnets)) {
		want[intent.FarmStateKey(id)] = mustJSON(f)
	}
	return w.sync(farmKeys(m), intent.FarmStatePrefix, want)
}

// farmKeys are the farm-state keys written: one per farm of the plan at
// most.
func farmKeys(m *model) map[string]bool {
	out := map[string]bool{}
	for k, v := range m.written {
		if _, ok := intent.ParseFarmStateKey(k); ok && v != nil {
			out[k] = true
		}
	}
	return out
}
