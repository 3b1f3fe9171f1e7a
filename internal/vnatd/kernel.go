package vnatd

import (
	"io"
	"net/netip"
	"sync"

	"github.com/onehop/onehop/internal/vcmp"
	"github.com/onehop/onehop/internal/vnat"
)

// kernel is the Translator over internal/vnat: the thin adapter between the
// engine's tuples and the datapath's.
type kernel struct {
	d     *vnat.Kernel
	iface string
	held  *held
}

// held are the ports reserved for moved connections whose own port was
// taken at their new address, by virtual tuple.
type held struct {
	mu    sync.Mutex
	ports map[vcmp.Tuple]io.Closer
}

func newKernel(d *vnat.Kernel, iface string) kernel {
	return kernel{d: d, iface: iface, held: &held{ports: map[vcmp.Tuple]io.Closer{}}}
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
		out = append(out, Mapping{Virtual: vcmp.Tuple(c.Virtual), Physical: vcmp.Tuple(c.Physical),
			Closed: c.Source == "translate"})
	}
	return out, nil
}

func (k kernel) Translate(ms []Mapping) error {
	if len(ms) == 1 {
		return k.d.Translate(vnat.Virtual(ms[0].Virtual), vnat.Physical(ms[0].Physical))
	}
	vm := make([]vnat.Migration, len(ms))
	for i, m := range ms {
		vm[i] = vnat.Migration{Virtual: vnat.Virtual(m.Virtual), Physical: vnat.Physical(m.Physical)}
	}
	return k.d.TranslateBatch(vm)
}

func (k kernel) Accept(ms []Mapping) error {
	vm := make([]vnat.Migration, len(ms))
	for i, m := range ms {
		vm[i] = vnat.Migration{Virtual: vnat.Virtual(m.Virtual), Physical: vnat.Physical(m.Physical)}
	}
	return k.d.Accept(vm)
}

func (k kernel) Unaccept(vs []vcmp.Tuple) error {
	vv := make([]vnat.Virtual, len(vs))
	for i, v := range vs {
		vv[i] = vnat.Virtual(v)
	}
	return k.d.Unaccept(vv)
}

func (k kernel) KeepLocal(a netip.Addr) error { return k.d.KeepLocal(a, k.iface) }

func (k kernel) Forget(v vcmp.Tuple) error { return k.d.Forget(vnat.Virtual(v)) }

// CloseSocket closes the socket whose own tuple is v (sock_diag
// SOCK_DESTROY): a preempted connection's application sees ECONNABORTED.
func (k kernel) CloseSocket(v vcmp.Tuple) error { return k.d.DestroySocket(vnat.Tuple(v)) }

// keepalive is the keepalive helper over the datapath (vnat_away): while a
// TCP connection's peer is away, this end's egress answers the
// connection's keepalive probes. UDP has no keepalives.
type keepalive struct{ d *vnat.Kernel }

func (keepalive) Name() string { return "keepalive" }

func (k keepalive) Start(v vcmp.Tuple) error {
	if v.Proto != vcmp.TCP {
		return nil
	}
	return k.d.StartKeepalive(vnat.Virtual(v))
}

func (k keepalive) Stop(v vcmp.Tuple) error {
	if v.Proto != vcmp.TCP {
		return nil
	}
	_, err := k.d.StopKeepalive(vnat.Virtual(v))
	return err
}

// SocketsAt lists the endpoint's sockets at addr or the wildcard (sock_diag).
func (k kernel) SocketsAt(addr netip.Addr) ([]Socket, error) {
	ss, err := k.d.SocketsAt(addr)
	if err != nil {
		return nil, err
	}
	out := make([]Socket, len(ss))
	for i, s := range ss {
		out[i] = Socket{Proto: s.Proto, Local: s.Local, Remote: s.Remote, Listening: s.Listening}
	}
	return out, nil
}

// Reserve holds a port the kernel picks at addr for virtual.
func (k kernel) Reserve(virtual vcmp.Tuple, addr netip.Addr) (uint16, error) {
	return k.hold(virtual, netip.AddrPortFrom(addr, 0))
}

// Hold holds the port at for virtual.
func (k kernel) Hold(virtual vcmp.Tuple, at netip.AddrPort) error {
	_, err := k.hold(virtual, at)
	return err
}

func (k kernel) hold(virtual vcmp.Tuple, at netip.AddrPort) (uint16, error) {
	p, c, err := k.d.ReservePort(virtual.Proto, at)
	if err != nil {
		return 0, err
	}
	k.held.mu.Lock()
	defer k.held.mu.Unlock()
	if old, ok := k.held.ports[virtual]; ok {
		old.Close() //nolint:errcheck // replaced: a close error changes nothing
	}
	k.held.ports[virtual] = c
	return p, nil
}

// Release gives virtual's port back.
func (k kernel) Release(virtual vcmp.Tuple) error {
	k.held.mu.Lock()
	defer k.held.mu.Unlock()
	c, ok := k.held.ports[virtual]
	if !ok {
		return nil
	}
	delete(k.held.ports, virtual)
	return c.Close()
}
