package vnat

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TCP states as sock_diag reports them (include/net/tcp_states.h).
const (
	tcpEstablished = 1
	tcpSynSent     = 2
	tcpSynRecv     = 3
	tcpTimeWait    = 6
	tcpClose       = 7
	tcpListen      = 10
)

// PickUp records the TCP connections and connected UDP sockets already
// open in the endpoint's namespace (paper §5: VNAT can virtualize
// connections opened before it started, their virtual tuple being their
// physical one). It returns how many it found. Sockops records new TCP
// connections from then on; UDP has no established event, so connected
// UDP sockets are found this way only: call PickUp again before a move
// (a cgroup connect4 hook runs before the kernel picks the local port, so
// it cannot know the tuple).
func (d *Kernel) PickUp() (int, error) {
	h, err := d.handle()
	if err != nil {
		return 0, err
	}
	defer h.Close()
	tcp, err := retryDump(func() ([]*netlink.Socket, error) { return h.SocketDiagTCP(unix.AF_INET) })
	if err != nil {
		return 0, fmt.Errorf("vnat: sock_diag tcp: %w", err)
	}
	udp, err := retryDump(func() ([]*netlink.Socket, error) { return h.SocketDiagUDP(unix.AF_INET) })
	if err != nil {
		return 0, fmt.Errorf("vnat: sock_diag udp: %w", err)
	}
	found := map[Tuple]Conn{}
	for _, s := range tcp {
		switch s.State {
		case tcpSynSent, tcpSynRecv, tcpTimeWait, tcpClose, tcpListen:
			continue
		}
		if t, ok := tupleOfSocket(TCP, s); ok {
			found[t] = Conn{Virtual: Virtual(t), Physical: Physical(t), State: StateActive,
				TCPState: tcpStateName(uint32(s.State)), Source: "sock_diag", Cookie: cookieOf(s)}
		}
	}
	for _, s := range udp {
		// A connected UDP socket reports TCP_ESTABLISHED; an unconnected one
		// has no remote end and nothing to migrate.
		if s.State != tcpEstablished {
			continue
		}
		if t, ok := tupleOfSocket(UDP, s); ok {
			found[t] = Conn{Virtual: Virtual(t), Physical: Physical(t), State: StateActive,
				Source: "sock_diag", Cookie: cookieOf(s)}
		}
	}
	d.mu.Lock()
	d.diag = found
	d.mu.Unlock()
	return len(found), nil
}

func tupleOfSocket(p Proto, s *netlink.Socket) (Tuple, bool) {
	l, ok1 := netip.AddrFromSlice(s.ID.Source.To4())
	r, ok2 := netip.AddrFromSlice(s.ID.Destination.To4())
	if !ok1 || !ok2 || l.IsUnspecified() || r.IsUnspecified() || s.ID.DestinationPort == 0 {
		return Tuple{}, false
	}
	return Tuple{Proto: p, Local: netip.AddrPortFrom(l, s.ID.SourcePort),
		Remote: netip.AddrPortFrom(r, s.ID.DestinationPort)}, true
}

func cookieOf(s *netlink.Socket) uint64 {
	return uint64(s.ID.Cookie[1])<<32 | uint64(s.ID.Cookie[0])
}

// retryDump retries a dump the kernel interrupted (the socket table changed
// under it), as netlink asks.
func retryDump(f func() ([]*netlink.Socket, error)) ([]*netlink.Socket, error) {
	var err error
	for range 5 {
		var ss []*netlink.Socket
		ss, err = f()
		if err == nil {
			return ss, nil
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, err
		}
	}
	return nil, err
}
