package controller

import (
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/policy"
)

// sliverKeys is the port-space part (docs/port-space.md): each sliver
// (intent.SliversPrefix) compiled into its LocalSliver under its host's
// desired prefix (intent.DesiredSliverKind).
type sliverKeys struct {
	slivers map[string]intent.Sliver // HOST/NAME
	written map[string]bool          // HOST/NAME of every sliver key the store holds
	marked  map[string]bool          // HOST/NAME
}

func (p *sliverKeys) records() []recordKind {
	return []recordKind{{prefix: intent.SliversPrefix, apply: p.apply}}
}

func (*sliverKeys) desiredKind() string { return intent.DesiredSliverKind }

func (p *sliverKeys) reset() {
	p.slivers, p.written, p.marked = map[string]intent.Sliver{}, map[string]bool{}, map[string]bool{}
}

func (p *sliverKeys) apply(_ *model, name string, v []byte, deleted bool) error {
	if err := applyRecord(p.slivers, name, v, deleted); err != nil {
		return err
	}
	p.marked[name] = true
	return nil
}

func (p *sliverKeys) noted(host, name string, present bool) {
	if present {
		p.written[host+"/"+name] = true
	} else {
		delete(p.written, host+"/"+name)
	}
}

func (p *sliverKeys) hostChanged(m *model, host string) {
	for name, s := range p.slivers {
		if s.Host == host {
			p.marked[name] = true // a host's slivers are few
		}
	}
	for _, name := range m.desiredNames(host, intent.DesiredSliverKind) {
		p.marked[host+"/"+name] = true
	}
}

func (p *sliverKeys) markAll(*model) {
	markEach(p.marked, p.slivers)
	markEach(p.marked, p.written)
}

func (p *sliverKeys) compile(m *model, w *keyWriter) error {
	for _, name := range takeMarks(&p.marked) {
		var want string
		s, ok := p.slivers[name]
		if ok {
			if _, ok := m.hosts[s.Host]; ok {
				want = intent.DesiredSliverKey(s.Host, s.Name)
			}
		}
		if p.written[name] {
			host, sname, _ := strings.Cut(name, "/")
			if k := intent.DesiredSliverKey(host, sname); k != want {
				if err := w.del(k); err != nil {
					return err
				}
			}
		}
		if want != "" {
			if err := w.put(want, mustJSON(policy.LocalSliver(s))); err != nil {
				return err
			}
		}
	}
	return nil
}
