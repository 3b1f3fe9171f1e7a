package controller

import (
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/policy"
)

// vmKeys is each VM's key (intent.DesiredVMKind) under the desired prefix
// of the host it is on: its LocalEndpoint, compiled from the VM alone. A
// VM that moves has its key under the host it left deleted.
type vmKeys struct {
	at     map[string]string // FARM/SUBNET/VM -> the host its key is written under
	marked map[string]bool   // FARM/SUBNET/VM
}

func (*vmKeys) records() []recordKind { return nil }
func (*vmKeys) desiredKind() string   { return intent.DesiredVMKind }

func (p *vmKeys) reset() { p.at, p.marked = map[string]string{}, map[string]bool{} }

func (p *vmKeys) noted(host, full string, present bool) {
	if present {
		p.at[full] = host
	} else if p.at[full] == host {
		delete(p.at, full)
	}
}

func (p *vmKeys) hostChanged(m *model, host string) {
	for full := range m.onHost[host] {
		p.marked[full] = true
	}
	for _, full := range m.desiredNames(host, intent.DesiredVMKind) {
		p.marked[full] = true
	}
}

func (p *vmKeys) vmChanged(_ *model, full string, _, _ *intent.VM) { p.marked[full] = true }

func (p *vmKeys) markAll(m *model) {
	markEach(p.marked, m.vms)
	markEach(p.marked, p.at)
}

func (p *vmKeys) compile(m *model, w *keyWriter) error {
	for _, full := range takeMarks(&p.marked) {
		var want string
		if vm, ok := m.vms[full]; ok {
			if _, ok := m.hosts[vm.Host]; ok {
				want = intent.DesiredVMKey(vm.Host, full)
			}
		}
		if at, ok := p.at[full]; ok && intent.DesiredVMKey(at, full) != want {
			if err := w.del(intent.DesiredVMKey(at, full)); err != nil {
				return err
			}
		}
		if want != "" {
			if err := w.put(want, mustJSON(policy.LocalEndpoint(m.vms[full]))); err != nil {
				return err
			}
		}
	}
	return nil
}
