package controller

import (
	"slices"
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/policy"
	"github.com/onehop/onehop/internal/tappolicy"
)

// tapKeys is the TAP part (docs/tap.md): the policies
// (intent.TapsPrefix) resolved against every VM into rules, and each rule
// under the desired prefix of every host that plays a part in it
// (intent.DesiredTapKind).
type tapKeys struct {
	policies map[string]intent.TapPolicy
	captures map[string]intent.TapCaptureRecord // running captures, by policy
	rules    []intent.TapRule                   // as last compiled
	redo     bool                               // the rules may have changed
	on       map[string]bool                    // hosts whose TAP keys may have changed
}

func (p *tapKeys) records() []recordKind {
	return []recordKind{{prefix: intent.TapsPrefix, apply: p.apply}, {prefix: intent.TapCapturesPrefix, apply: p.applyCapture}}
}

func (*tapKeys) desiredKind() string { return intent.DesiredTapKind }

func (p *tapKeys) reset() {
	p.policies, p.rules, p.redo, p.on = map[string]intent.TapPolicy{}, nil, false, map[string]bool{}
	p.captures = map[string]intent.TapCaptureRecord{}
}

func (p *tapKeys) apply(_ *model, name string, v []byte, deleted bool) error {
	if err := applyRecord(p.policies, name, v, deleted); err != nil {
		return err
	}
	p.redo = true
	return nil
}

func (p *tapKeys) applyCapture(_ *model, name string, v []byte, deleted bool) error {
	if err := applyRecord(p.captures, name, v, deleted); err != nil {
		return err
	}
	p.redo = true
	return nil
}

// withCaptures adds, for each running capture, its policy's rules again
// with the capture's collector (ERSPAN II, the policy's id as session) and
// intent.TapCapture in their ids: the hosts of the policy's senders copy to
// it beside the policy's own monitor or collector.
func withCaptures(rules []intent.TapRule, captures map[string]intent.TapCaptureRecord) []intent.TapRule {
	if len(captures) == 0 {
		return rules
	}
	out := slices.Clone(rules)
	for _, r := range rules {
		c, ok := captures[r.Policy]
		if !ok {
			continue
		}
		r.ID |= intent.TapCapture
		r.MonitorIP, r.MonitorHost = "", ""
		r.Collector, r.Encap = c.Collector, tappolicy.EncapERSPAN2
		out = append(out, r)
	}
	return out
}

func (*tapKeys) noted(_, _ string, _ bool) {}

func (p *tapKeys) hostChanged(_ *model, host string) { p.on[host] = true }

func (p *tapKeys) farmsChanged(*model) { p.redo = true }

// vmChanged marks the hosts the VM left and joined: which hosts play a
// part in a rule that names a subnet or any VM follows from the VMs of
// each host alone. Only a VM a policy names can change the rules.
func (p *tapKeys) vmChanged(_ *model, _ string, old, now *intent.VM) {
	for _, vm := range []*intent.VM{old, now} {
		if vm != nil {
			p.on[vm.Host] = true
			p.redo = p.redo || p.names(*vm)
		}
	}
}

// names reports whether a policy names vm (by name, address or MAC) as
// its sender, receiver or monitor.
func (p *tapKeys) names(vm intent.VM) bool {
	for _, tp := range p.policies {
		for _, end := range []string{tp.Sender, tp.Receiver, tp.Monitor} {
			r, err := tappolicy.ParseRef(end)
			if err != nil {
				return true // cannot tell: compile the rules again
			}
			switch r.Kind {
			case tappolicy.KindVM:
				if r.Named() == vm.FullName() {
					return true
				}
			case tappolicy.KindIP:
				if r.IP.String() == vm.IP {
					return true
				}
			case tappolicy.KindMAC:
				if strings.EqualFold(r.MAC, vm.MAC) {
					return true
				}
			}
		}
	}
	return false
}

func (p *tapKeys) markAll(m *model) {
	p.redo, p.rules = true, nil
	p.onEveryHost(m)
}

// onEveryHost marks every host, and every host with desired keys.
func (p *tapKeys) onEveryHost(m *model) {
	markEach(p.on, m.hosts)
	markEach(p.on, m.keysOf)
}

func (p *tapKeys) compile(m *model, w *keyWriter) error {
	if p.redo {
		p.redo = false
		rules := []intent.TapRule(nil)
		if len(p.policies) > 0 {
			rules = withCaptures(policy.TapRules(policy.State{Farms: sortedValues(m.farms), Subnets: sortedValues(m.subnets),
				VMs: sortedValues(m.vms), Taps: sortedValues(p.policies)}), p.captures)
		}
		if !equalJSON(rules, p.rules) {
			p.rules = rules
			p.onEveryHost(m)
		}
	}
	on := takeMarks(&p.on)
	if len(p.rules) == 0 && m.counts[intent.DesiredTapKind] == 0 {
		return nil // no TAP anywhere: nothing to look at
	}
	for _, h := range on {
		want := map[string][]byte{}
		if _, ok := m.hosts[h]; ok && len(p.rules) > 0 {
			var local []intent.VM
			for full := range m.onHost[h] {
				local = append(local, m.vms[full])
			}
			for _, r := range policy.LocalTaps(p.rules, local, h) {
				want[intent.DesiredTapKey(h, r.ID)] = mustJSON(r)
			}
		}
		if len(want) == 0 && len(m.keysOf[h]) == 0 {
			continue
		}
		if err := w.sync(m.keysOf[h], intent.DesiredKindPrefix(h, intent.DesiredTapKind), want); err != nil {
			return err
		}
	}
	return nil
}
