package vnatd

import (
	"net/netip"

	"github.com/onehop/onehop/internal/vcmp"
	"github.com/onehop/onehop/internal/vnat"
)

// kernel is the Translator over internal/vnat: the thin adapter between the
// engine's tuples and the datapath's.
type kernel struct {
	d     *vnat.Datapath
	iface string
}

func toVCMP(t vnat.Tuple) vcmp.Tuple {
	return vcmp.Tuple{Proto: vcmp.Proto(t.Proto), Local: t.Local, Remote: t.Remote}
}

func toVNAT(t vcmp.Tuple) vnat.Tuple {
	return vnat.Tuple{Proto: vnat.Proto(t.Proto), Local: t.Local, Remote: t.Remote}
}

// Conns picks up the open connections (sock_diag: TCP and connected UDP)
// and lists them with the migrated ones.
func (k kernel) Conns() ([]Mapping, error) {
	if _, err := k.d.PickUp(); err != nil {
		return nil, err
	}
	cs, err := k.d.Connections()
	if err != nil {
		return nil, err
	}
	out := make([]Mapping, 0, len(cs))
	for _, c := range cs {
		// A migrated connection that neither sock_diag nor sockops sees
		// any more is only in the translation table: closed.
		out = append(out, Mapping{Virtual: toVCMP(vnat.Tuple(c.Virtual)), Physical: toVCMP(vnat.Tuple(c.Physical)),
			Closed: c.Source == "translate"})
	}
	return out, nil
}

func (k kernel) Translate(ms []Mapping) error {
	if len(ms) == 1 {
		return k.d.Translate(vnat.Virtual(toVNAT(ms[0].Virtual)), vnat.Physical(toVNAT(ms[0].Physical)))
	}
	vm := make([]vnat.Migration, len(ms))
	for i, m := range ms {
		vm[i] = vnat.Migration{Virtual: vnat.Virtual(toVNAT(m.Virtual)), Physical: vnat.Physical(toVNAT(m.Physical))}
	}
	return k.d.TranslateBatch(vm)
}

func (k kernel) KeepLocal(a netip.Addr) error { return k.d.KeepLocal(a, k.iface) }

func (k kernel) Forget(v vcmp.Tuple) error { return k.d.Forget(vnat.Virtual(toVNAT(v))) }

// keepalive is the keepalive helper over the datapath (vnat_away): while a
// TCP connection's peer is away, this end's egress answers the
// connection's keepalive probes. UDP has no keepalives.
type keepalive struct{ d *vnat.Datapath }

func (keepalive) Name() string { return "keepalive" }

func (k keepalive) Start(v vcmp.Tuple) error {
	if v.Proto != vcmp.TCP {
		return nil
	}
	return k.d.StartKeepalive(vnat.Virtual(toVNAT(v)))
}

func (k keepalive) Stop(v vcmp.Tuple) error {
	if v.Proto != vcmp.TCP {
		return nil
	}
	_, err := k.d.StopKeepalive(vnat.Virtual(toVNAT(v)))
	return err
}
