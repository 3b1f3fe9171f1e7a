package vnatd

import (
	"net/netip"

	"github.com/onehop/onehop/internal/vcmp"
)

// Socket is a socket at this endpoint, as Ports reports it.
type Socket struct {
	Proto     vcmp.Proto
	Local     netip.AddrPort // its address may be 0.0.0.0
	Remote    netip.AddrPort // invalid when not connected
	Listening bool           // a TCP listener
}

// Ports is what a Translator that knows the endpoint's sockets offers for
// choosing a moved connection's physical port (issue 10, behaviour 2: "a
// physical port may differ from the virtual one when the old one is taken
// at the new place"). A Translator without it keeps every port.
type Ports interface {
	// SocketsAt lists the sockets bound to addr or to the wildcard.
	SocketsAt(addr netip.Addr) ([]Socket, error)
	// Reserve has the kernel pick a free port at addr for virtual's
	// protocol and holds it for virtual until Release.
	Reserve(virtual vcmp.Tuple, addr netip.Addr) (uint16, error)
	// Hold holds the port at (taken already by an earlier run of the
	// daemon, whose pinned translation this one took over) for virtual
	// until Release.
	Hold(virtual vcmp.Tuple, at netip.AddrPort) error
	// Release gives virtual's reserved port back (none: nothing).
	Release(virtual vcmp.Tuple) error
}

// portTaken says whether phys, a connection's physical tuple at this end,
// would share its packets with another socket (socks) or another
// connection's translation (used): the same 4-tuple; for UDP also a socket
// bound there and not connected (it receives from anyone); for TCP a
// socket bound there that is neither connected nor listening (it took the
// port with bind). A listener never sees an established connection's
// segments, so it takes nothing.
func portTaken(phys vcmp.Tuple, socks []Socket, used map[vcmp.Tuple]bool) bool {
	if used[phys] {
		return true
	}
	for _, s := range socks {
		if s.Proto != phys.Proto || s.Local.Port() != phys.Local.Port() {
			continue
		}
		if a := s.Local.Addr(); a != phys.Local.Addr() && !a.IsUnspecified() {
			continue
		}
		if s.Remote == phys.Remote {
			return true
		}
		if !s.Remote.IsValid() && !s.Listening {
			return true
		}
	}
	return false
}
