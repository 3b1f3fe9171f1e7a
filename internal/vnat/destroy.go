package vnat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	onehopns "github.com/onehop/onehop/internal/netns"
)

// ErrDestroyUnsupported is DestroySocket's error when the kernel cannot
// close another process's socket: the protocol's sock_diag handler has no
// destroy (CONFIG_INET_DIAG_DESTROY off, or an old udp_diag), so
// SOCK_DESTROY answers EOPNOTSUPP.
var ErrDestroyUnsupported = errors.New("the kernel cannot close sockets through sock_diag SOCK_DESTROY (built without CONFIG_INET_DIAG_DESTROY?)")

// DestroySocket closes the endpoint's socket whose own tuple is t, as
// `ss -K` does (netlink sock_diag SOCK_DESTROY): the kernel aborts it, so
// the application's next read or write fails with ECONNABORTED (a TCP
// socket also sends a RESET). It is how a connection preempted in a
// virtual-identification conflict (paper §3.4.2) is closed for real: its
// packets belong to another connection now, and left alone its socket
// would linger until its own timers gave up. Needs CAP_NET_ADMIN; a kernel
// that cannot do it answers ErrDestroyUnsupported, a socket that is not
// there (any more) unix.ENOENT.
//
// The socket is named by its cookie too, read from a sock_diag dump
// where its tuple matches exactly: the kernel finds the socket to destroy
// with a packet's lookup, which falls back to a TCP listener or an
// unconnected UDP socket on the port when the connection itself is gone,
// and without the cookie would destroy that instead.
func (d *Kernel) DestroySocket(t Tuple) error {
	if err := validate(t); err != nil {
		return fmt.Errorf("vnat: destroy socket: %w", err)
	}
	cookie, err := d.cookieOf(t)
	if err != nil {
		return fmt.Errorf("vnat: destroy socket %s: %w", t, err)
	}
	if err := d.destroy(destroyRequest{t: t, cookie: cookie}); err != nil {
		return fmt.Errorf("vnat: destroy socket %s: %w", t, err)
	}
	return nil
}

// CanDestroySockets says whether DestroySocket can work here, for TCP and
// UDP: it asks the kernel to destroy a socket no one has (cookie 0, which
// the kernel never gives out, so nothing can be hit). nil: it can; else
// why not (ErrDestroyUnsupported, or no CAP_NET_ADMIN).
func (d *Kernel) CanDestroySockets() error {
	var errs []error
	for _, p := range []Proto{TCP, UDP} {
		lo := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), 1)
		t := Tuple{Proto: p, Local: lo, Remote: lo}
		err := d.destroy(destroyRequest{t: t, cookie: [2]uint32{0, 0}})
		switch {
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ESTALE):
			// Looked up, not found (or not that cookie): destroy works.
		case err == nil:
			// Cannot happen (cookie 0); nothing to report.
		default:
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("vnat: sock_diag destroy: %w", errors.Join(errs...))
	}
	return nil
}

// destroy sends one SOCK_DESTROY request in the endpoint's namespace.
func (d *Kernel) destroy(r destroyRequest) error {
	err := onehopns.DoPath(d.opts.Netns, func() error {
		req := nl.NewNetlinkRequest(nl.SOCK_DESTROY, unix.NLM_F_ACK)
		req.AddData(r)
		_, err := req.Execute(unix.NETLINK_INET_DIAG, 0)
		return err
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EOPNOTSUPP):
		// inet_diag_cmd_exact: the protocol's handler has no destroy.
		return fmt.Errorf("%w: %w", ErrDestroyUnsupported, err)
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("no such socket: %w", err)
	case errors.Is(err, unix.ESTALE):
		return fmt.Errorf("the socket with that tuple is another one now (cookie changed): %w", err)
	}
	return err
}

// cookieOf is the cookie of the socket whose tuple is exactly t (not a
// listener, not closing), from a sock_diag dump.
func (d *Kernel) cookieOf(t Tuple) ([2]uint32, error) {
	h, err := d.handle()
	if err != nil {
		return [2]uint32{}, err
	}
	defer h.Close()
	dump := func() ([]*netlink.Socket, error) { return h.SocketDiagTCP(unix.AF_INET) }
	if t.Proto == UDP {
		dump = func() ([]*netlink.Socket, error) { return h.SocketDiagUDP(unix.AF_INET) }
	}
	ss, err := retryDump(dump)
	if err != nil {
		return [2]uint32{}, fmt.Errorf("sock_diag %s: %w", t.Proto, err)
	}
	for _, s := range ss {
		if got, ok := tupleOfSocket(t.Proto, s); !ok || got != t {
			continue
		}
		if t.Proto == TCP && (s.State == tcpListen || s.State == tcpTimeWait || s.State == tcpClose) {
			continue
		}
		return s.ID.Cookie, nil
	}
	return [2]uint32{}, fmt.Errorf("no such socket: %w", unix.ENOENT)
}

// destroyRequest is the SOCK_DESTROY request for one socket: struct
// inet_diag_req_v2 (include/uapi/linux/inet_diag.h) naming the socket by
// its tuple and cookie.
type destroyRequest struct {
	t      Tuple
	cookie [2]uint32
}

// destroyRequestLen is sizeof(struct inet_diag_req_v2).
const destroyRequestLen = 56

func (destroyRequest) Len() int { return destroyRequestLen }

func (r destroyRequest) Serialize() []byte {
	b := make([]byte, destroyRequestLen)
	b[0] = unix.AF_INET
	b[1] = byte(r.t.Proto)
	// b[2] extensions, b[3] pad: 0.
	binary.NativeEndian.PutUint32(b[4:], ^uint32(0)) // every state
	// struct inet_diag_sockid: ports and addresses in network order.
	binary.BigEndian.PutUint16(b[8:], r.t.Local.Port())
	binary.BigEndian.PutUint16(b[10:], r.t.Remote.Port())
	src, dst := r.t.Local.Addr().As4(), r.t.Remote.Addr().As4()
	copy(b[12:], src[:])
	copy(b[28:], dst[:])
	// idiag_if (b[44:48]) 0: any interface.
	binary.NativeEndian.PutUint32(b[48:], r.cookie[0])
	binary.NativeEndian.PutUint32(b[52:], r.cookie[1])
	return b
}
