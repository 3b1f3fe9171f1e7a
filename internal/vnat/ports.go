package vnat

import (
	"fmt"
	"io"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	onehopns "github.com/onehop/onehop/internal/netns"
)

// Socket is a TCP or UDP socket of the endpoint as sock_diag reports it.
type Socket struct {
	Proto  Proto
	Local  netip.AddrPort // its address may be 0.0.0.0 (bound to every address)
	Remote netip.AddrPort // invalid when the socket is not connected
	// Listening: a TCP listener (it takes SYNs, never a connection's
	// segments).
	Listening bool
}

// SocketsAt lists the TCP and UDP sockets whose local address is addr or
// the wildcard: the ones a physical tuple at addr could share packets
// with (a port taken at a moved end's new address, paper §3.2).
func (d *Kernel) SocketsAt(addr netip.Addr) ([]Socket, error) {
	h, err := d.handle()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	tcp, err := retryDump(func() ([]*netlink.Socket, error) { return h.SocketDiagTCP(unix.AF_INET) })
	if err != nil {
		return nil, fmt.Errorf("vnat: sock_diag tcp: %w", err)
	}
	udp, err := retryDump(func() ([]*netlink.Socket, error) { return h.SocketDiagUDP(unix.AF_INET) })
	if err != nil {
		return nil, fmt.Errorf("vnat: sock_diag udp: %w", err)
	}
	var out []Socket
	add := func(p Proto, s *netlink.Socket) {
		l, ok := netip.AddrFromSlice(s.ID.Source.To4())
		if !ok || (l != addr && !l.IsUnspecified()) {
			return
		}
		so := Socket{Proto: p, Local: netip.AddrPortFrom(l, s.ID.SourcePort), Listening: p == TCP && s.State == tcpListen}
		if r, ok := netip.AddrFromSlice(s.ID.Destination.To4()); ok && !r.IsUnspecified() && s.ID.DestinationPort != 0 {
			so.Remote = netip.AddrPortFrom(r, s.ID.DestinationPort)
		}
		out = append(out, so)
	}
	for _, s := range tcp {
		add(TCP, s)
	}
	for _, s := range udp {
		add(UDP, s)
	}
	return out, nil
}

// ReservePort keeps a port at at.Addr() for proto from every other socket
// until the returned Closer is closed: a socket bound there (not
// listening, not connected) makes bind() of that port fail and connect()
// pass it over when it picks an ephemeral port. Port 0 has the kernel
// choose a free one. It is a moved connection's physical port when its
// own was taken at the new address.
func (d *Kernel) ReservePort(p Proto, at netip.AddrPort) (uint16, io.Closer, error) {
	addr := at.Addr()
	typ := unix.SOCK_STREAM
	if p == UDP {
		typ = unix.SOCK_DGRAM
	}
	var fd, port int
	err := onehopns.DoPath(d.opts.Netns, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		if p == UDP {
			// Datagrams to the port that are not translated would
			// queue here unread: keep the queue small.
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 0); err != nil {
				unix.Close(fd)
				return err
			}
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.As4(), Port: int(at.Port())}); err != nil {
			unix.Close(fd)
			return err
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			unix.Close(fd)
			return err
		}
		port = sa.(*unix.SockaddrInet4).Port
		return nil
	})
	if err != nil {
		return 0, nil, fmt.Errorf("vnat: reserve %s port %s: %w", p, at, err)
	}
	return uint16(port), fdCloser(fd), nil
}

type fdCloser int

func (f fdCloser) Close() error { return unix.Close(int(f)) }
